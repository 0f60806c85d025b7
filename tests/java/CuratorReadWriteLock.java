// One side of Apache Curator's InterProcessReadWriteLock on a lock path, for the dlock
// interop test of shared locks.
//
//     java CuratorReadWriteLock HOSTS PATH read|write TIMEOUT_MS
//
// Acquires the read or the write lock of PATH (waiting at most TIMEOUT_MS; a negative value
// waits for ever), prints ACQUIRED, releases when a line (or EOF) arrives on stdin, prints
// RELEASED and exits 0. Prints BUSY and exits 3 when the wait ran out.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

public class CuratorReadWriteLock {
    public static void main(String[] args) throws Exception {
        String hosts = args[0];
        String path = args[1];
        String side = args[2];
        long timeoutMs = Long.parseLong(args[3]);
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(hosts, 3000, 3000, new RetryNTimes(3, 100));
        client.start();
        InterProcessReadWriteLock lock = new InterProcessReadWriteLock(client, path);
        InterProcessMutex mutex;
        if (side.equals("read")) {
            mutex = lock.readLock();
        } else if (side.equals("write")) {
            mutex = lock.writeLock();
        } else {
            System.err.println("usage: CuratorReadWriteLock HOSTS PATH read|write TIMEOUT_MS");
            System.exit(64);
            return;
        }
        boolean acquired;
        if (timeoutMs < 0) {
            mutex.acquire();
            acquired = true;
        } else {
            acquired = mutex.acquire(timeoutMs, TimeUnit.MILLISECONDS);
        }
        if (!acquired) {
            System.out.println("BUSY");
            System.out.flush();
            client.close();
            System.exit(3);
        }
        System.out.println("ACQUIRED");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in)).readLine();
        mutex.release();
        client.close();
        System.out.println("RELEASED");
        System.out.flush();
        System.exit(0);
    }
}
