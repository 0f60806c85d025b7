//! A private ZooKeeper per test (standalone or an ensemble of three) with a short tickTime,
//! its four-letter words, and a client session for looking at its nodes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The jars a ZooKeeper server needs, from Debian's `zookeeper` package.
pub fn zookeeper_classpath() -> String {
    let jars = [
        "/usr/share/java/zookeeper.jar",
        "/usr/share/java/zookeeper-jute.jar",
        "/usr/share/java/slf4j-simple.jar",
    ];
    for jar in jars {
        assert!(
            Path::new(jar).is_file(),
            "{jar} is missing: run `apt-get install -y zookeeper` (or `bash .ci/run`, which installs every test server)"
        );
    }
    jars.join(":")
}

/// Send a four-letter word to a ZooKeeper server and return its answer (bounded).
pub fn zk_four_letter(port: u16, word: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// The `Mode:` a ZooKeeper server reports (`standalone`, `leader`, `follower`), if it serves.
pub fn zk_mode(port: u16) -> Option<String> {
    zk_four_letter(port, "srvr")?
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

/// One ZooKeeper server started by a test; killed (by pid) when dropped.
pub struct ZkMember {
    pub client_port: u16,
    config: PathBuf,
    main_class: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

impl ZkMember {
    fn launch(&mut self) {
        let java = server_binary("java", "openjdk-17-jre-headless");
        let classpath = zookeeper_classpath();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("zookeeper log");
        let log_dir = self.log.parent().expect("log dir").display().to_string();
        // `java` itself, not a wrapper script, so that killing the child kills the server.
        let mut command = Command::new(java);
        command
            .args([
                "-Xms32m",
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.admin.enableServer=false",
                // Empty container parents go away quickly, so tests see them recreated.
                "-Dznode.container.checkIntervalMs=500",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                &format!("-Dzookeeper.log.dir={log_dir}"),
                "-cp",
                &classpath,
                self.main_class,
            ])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = Some(spawn_server(&mut command, "java (ZooKeeper)"));
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn mode(&self) -> Option<String> {
        zk_mode(self.client_port)
    }
}

impl Drop for ZkMember {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private ZooKeeper (standalone, or an ensemble of three) on free loopback ports, with a
/// short tickTime so that session timeouts can be small (bounds 2 and 20 ticks).
pub struct ZkServer {
    pub members: Vec<ZkMember>,
    /// Kept for the life of the server: its data and logs.
    _dir: tempfile::TempDir,
}

impl ZkServer {
    /// A standalone ZooKeeper shared by every test of the run that calls this (see
    /// `shared`), as [`ZkServer::start`] starts it.
    pub fn shared() -> Shared<ZkServer> {
        static SERVER: std::sync::OnceLock<ZkServer> = std::sync::OnceLock::new();
        shared(&SERVER, ZkServer::start)
    }

    /// One standalone server, tickTime 200 ms: session timeouts 0.4 s to 4 s.
    pub fn start() -> ZkServer {
        ZkServer::build(1, 200)
    }

    /// One standalone server with `maxClientCnxns` as given; `None`: as ZooKeeper ships (no
    /// line in zoo.cfg, 60 connections per client address). The others allow any number.
    pub fn with_max_client_cnxns(limit: Option<u32>) -> ZkServer {
        ZkServer::build_with(1, 200, limit)
    }

    /// `size` members forming one ensemble.
    pub fn ensemble(size: usize, tick_ms: u64) -> ZkServer {
        ZkServer::build(size, tick_ms)
    }

    fn build(size: usize, tick_ms: u64) -> ZkServer {
        ZkServer::build_with(size, tick_ms, Some(0))
    }

    fn build_with(size: usize, tick_ms: u64, max_client_cnxns: Option<u32>) -> ZkServer {
        let dir = fast_server_dir();
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let mut members = Vec::new();
        for (i, &(client, peer, election)) in ports.iter().enumerate() {
            let home = dir.path().join(format!("m{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data).expect("data dir");
            let mut config = format!(
                "tickTime={tick_ms}\ndataDir={}\nclientPort={client}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\nautopurge.purgeInterval=0\n\
                 4lw.commands.whitelist=srvr,mntr,wchc,wchs,cons,ruok\n",
                data.display()
            );
            if let Some(limit) = max_client_cnxns {
                config.push_str(&format!("maxClientCnxns={limit}\n"));
            }
            let main_class = if size > 1 {
                config.push_str("initLimit=10\nsyncLimit=5\n");
                for (j, &(_, peer, election)) in ports.iter().enumerate() {
                    config.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1));
                }
                std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("myid");
                "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            } else {
                "org.apache.zookeeper.server.ZooKeeperServerMain"
            };
            let _ = (peer, election);
            let config_path = home.join("zoo.cfg");
            std::fs::write(&config_path, config).expect("zoo.cfg");
            members.push(ZkMember {
                client_port: client,
                config: config_path,
                main_class,
                log: home.join("zookeeper.log"),
                child: None,
            });
        }
        for member in &mut members {
            member.launch();
        }
        for member in &members {
            let port = member.client_port;
            let log = member.log.clone();
            let deadline = Instant::now() + Duration::from_secs(60);
            while zk_mode(port).is_none_or(|m| m == "unknown") {
                assert!(
                    Instant::now() < deadline,
                    "ZooKeeper on port {port} not serving within 60s: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        ZkServer { members, _dir: dir }
    }

    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Index of the member that leads the ensemble now.
    pub fn leader(&self) -> usize {
        self.members
            .iter()
            .position(|m| m.mode().as_deref() == Some("leader"))
            .expect("no leader")
    }

    /// Run `f` with a fresh session to the running members (the crate dlock uses).
    pub fn with_client<T>(
        &self,
        auth: Option<&str>,
        f: impl AsyncFnOnce(&zookeeper_client::Client) -> T,
    ) -> T {
        let hosts = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut connector = zookeeper_client::Client::connector()
                .with_session_timeout(Duration::from_secs(4))
                .with_fail_eagerly();
            if let Some(auth) = auth {
                connector = connector.with_auth("digest", auth.as_bytes());
            }
            let client = tokio::time::timeout(PATIENCE, connector.connect(&hosts))
                .await
                .expect("connect in time")
                .expect("connect to ZooKeeper");
            f(&client).await
        })
    }

    /// The children of `path` (empty when it does not exist).
    pub fn children(&self, path: &str) -> Vec<String> {
        let path = path.to_owned();
        self.with_client(None, async move |client| {
            match client.list_children(&path).await {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => Vec::new(),
                Err(e) => panic!("list {path}: {e}"),
            }
        })
    }
}

impl LockServer for ZkServer {
    fn url_at(&self, addr: &str) -> Option<(String, &'static str)> {
        Some((format!("zk://{addr}"), "a ZooKeeper server"))
    }

    fn url(&self) -> String {
        format!("zk://{}", self.endpoints())
    }

    fn scheme(&self) -> &'static str {
        "zk"
    }

    fn ttl(&self) -> Option<&'static str> {
        Some("3s")
    }
}

impl LeaseServer for ZkServer {
    fn port(&self) -> u16 {
        self.members[0].client_port
    }

    fn url_via(&self, port: u16) -> String {
        format!("zk://127.0.0.1:{port}")
    }

    fn as_lock_server(&self) -> &dyn LockServer {
        self
    }
}
