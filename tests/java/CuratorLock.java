// Apache Curator's InterProcessMutex on a lock path, for the dlock interop test.
//
//     java CuratorLock HOSTS PATH TIMEOUT_MS
//
// Acquires PATH (waiting at most TIMEOUT_MS; a negative value waits for ever), prints
// ACQUIRED, releases when a line (or EOF) arrives on stdin, prints RELEASED and exits 0.
// Prints BUSY and exits 3 when the wait ran out.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        String hosts = args[0];
        String path = args[1];
        long timeoutMs = Long.parseLong(args[2]);
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(hosts, 3000, 3000, new RetryNTimes(3, 100));
        client.start();
        InterProcessMutex mutex = new InterProcessMutex(client, path);
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
