/* The critical section of scripts/faults: what `dlock run` runs while holding the lock.
 *
 *   cs RUN_FILE INSIDE_DIR FENCE_ADDR FENCE_PORT BACKEND NEMESIS NAME HOST CLIENT SLEEP_MS
 *      FENCE_TIMEOUT_MS SKEW_FILE RUN_ID
 *
 * On entry it stamps enter_ns (CLOCK_BOOTTIME, the one clock shared by every namespace) and
 * the token ($DLOCK_FENCING_TOKEN) into RUN_FILE, writes INSIDE_DIR/<dlock pid> (one JSON line;
 * it exists exactly while the critical section runs, so the nemeses can find the holder; dlock is
 * our parent), accesses the
 * fencing resource once ("enter"), sleeps SLEEP_MS, accesses it again ("exit": the write a
 * paused or cut-off holder would make late, which a newer token must make the resource
 * refuse), removes the inside file and stamps exit_ns. SIGTERM (dlock stopping the command on lock
 * loss) stamps exit_ns too, then exits 143. SIGKILL cannot be stamped: the client then takes
 * the time dlock exited, which bounds the command (dlock waits for it).
 *
 * An unreachable fencing resource is recorded ("fence error"), never fatal: each access is
 * bounded by FENCE_TIMEOUT_MS for the connect and as much for the answer.
 *
 * RUN_FILE lines:  enter <ns> <token> <pid> <ppid>
 *                  fence <enter|exit> <ok|stale|error> <detail> <ns>
 *                  exit <ns> <normal|term>
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static int run_fd = -1;
static char inside_path[4096];

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Async-signal-safe decimal formatting (for the SIGTERM handler). */
static size_t fmt_ll(char *buf, long long v) {
    char tmp[24];
    size_t n = 0, i;
    int neg = v < 0;
    unsigned long long u = neg ? (unsigned long long)(-v) : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && n < sizeof tmp);
    i = 0;
    if (neg) buf[i++] = '-';
    while (n) buf[i++] = tmp[--n];
    return i;
}

static void put(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(run_fd, s, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

static void stamp_exit(const char *how) {
    char line[96];
    size_t n = 0;
    long long t = now_ns();
    memcpy(line, "exit ", 5);
    n = 5;
    n += fmt_ll(line + n, t);
    line[n++] = ' ';
    size_t h = strlen(how);
    memcpy(line + n, how, h);
    n += h;
    line[n++] = '\n';
    put(line, n);
}

static void on_term(int sig) {
    (void)sig;
    unlink(inside_path);
    stamp_exit("term");
    _exit(143);
}

/* One access: connect (bounded), send the line, read the answer (bounded). Writes the
 * outcome into out (ok|stale|error and a detail). */
static void fence_access(const char *addr, int port, const char *line, int timeout_ms,
                         char *out, size_t outlen) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(out, outlen, "error bad-address");
        return;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(out, outlen, "error socket:%d", errno);
        return;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        snprintf(out, outlen, "error connect:%d", errno);
        close(fd);
        return;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int r = poll(&p, 1, timeout_ms);
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (r <= 0) {
        snprintf(out, outlen, "error connect-timeout");
        close(fd);
        return;
    }
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr != 0) {
        snprintf(out, outlen, "error connect:%d", soerr);
        close(fd);
        return;
    }
    size_t len = strlen(line), off = 0;
    long long deadline = now_ns() + (long long)timeout_ms * 1000000LL;
    while (off < len) {
        ssize_t w = send(fd, line + off, len - off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                long long left = (deadline - now_ns()) / 1000000LL;
                if (left <= 0) break;
                p.events = POLLOUT;
                poll(&p, 1, (int)left);
                continue;
            }
            break;
        }
        off += (size_t)w;
    }
    if (off < len) {
        snprintf(out, outlen, "error send");
        close(fd);
        return;
    }
    char buf[128];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        long long left = (deadline - now_ns()) / 1000000LL;
        if (left <= 0) break;
        p.events = POLLIN;
        if (poll(&p, 1, (int)left) <= 0) continue;
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) break;
        got += (size_t)n;
        if (memchr(buf, '\n', got)) break;
    }
    close(fd);
    buf[got] = 0;
    char *nl = strchr(buf, '\n');
    if (!nl) {
        snprintf(out, outlen, "error answer-timeout");
        return;
    }
    *nl = 0;
    if (strncmp(buf, "OK ", 3) == 0)
        snprintf(out, outlen, "ok %s", buf + 3);
    else if (strncmp(buf, "STALE ", 6) == 0)
        snprintf(out, outlen, "stale %s", buf + 6);
    else
        snprintf(out, outlen, "error answer");
}

int main(int argc, char **argv) {
    if (argc != 14) {
        fprintf(stderr,
                "usage: cs RUN_FILE INSIDE_DIR FENCE_ADDR FENCE_PORT BACKEND NEMESIS NAME HOST "
                "CLIENT SLEEP_MS FENCE_TIMEOUT_MS SKEW_FILE RUN_ID\n");
        return 2;
    }
    long long enter = now_ns();
    const char *run_path = argv[1];
    snprintf(inside_path, sizeof inside_path, "%s/%d", argv[2], (int)getppid());
    const char *addr = argv[3];
    int port = atoi(argv[4]);
    const char *backend = argv[5], *nemesis = argv[6], *name = argv[7], *host = argv[8];
    const char *client = argv[9];
    long sleep_ms = atol(argv[10]);
    int fence_timeout_ms = atoi(argv[11]);
    const char *skew_file = argv[12], *run_id = argv[13];
    const char *token = getenv("DLOCK_FENCING_TOKEN");
    if (!token || !*token) token = "-1";

    run_fd = open(run_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (run_fd < 0) {
        perror("cs: run file");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);

    char line[512];
    int n = snprintf(line, sizeof line, "enter %lld %s %d %d\n", enter, token, (int)getpid(),
                     (int)getppid());
    put(line, (size_t)n);

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", inside_path);
    int ifd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (ifd >= 0) {
        char js[1024];
        int m = snprintf(js, sizeof js,
                         "{\"name\": \"%s\", \"host\": \"%s\", \"client\": \"%s\", "
                         "\"dlock_pid\": %d, \"cs_pid\": %d, \"token\": %s, \"enter_ns\": %lld, "
                         "\"run\": \"%s\", \"skew_file\": \"%s\"}\n",
                         name, host, client, (int)getppid(), (int)getpid(), token, enter,
                         run_id, skew_file);
        if (write(ifd, js, (size_t)m) == m) {
            close(ifd);
            rename(tmp, inside_path);
        } else {
            close(ifd);
            unlink(tmp);
        }
    }

    const char *whats[2] = {"enter", "exit"};
    for (int i = 0; i < 2; i++) {
        if (i == 1) {
            struct timespec ts = {.tv_sec = sleep_ms / 1000, .tv_nsec = (sleep_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
            }
        }
        char req[512], res[160];
        snprintf(req, sizeof req, "ACCESS %s %s %s %s %s %d %s\n", backend, nemesis, name, token,
                 host, (int)getpid(), whats[i]);
        fence_access(addr, port, req, fence_timeout_ms, res, sizeof res);
        n = snprintf(line, sizeof line, "fence %s %s %lld\n", whats[i], res, now_ns());
        put(line, (size_t)n);
    }
    /* The exit stamp and the inside file go together: block SIGTERM so that the handler
     * cannot stamp a second exit. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    unlink(inside_path);
    stamp_exit("normal");
    return 0;
}
