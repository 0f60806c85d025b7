/* A wall-clock error for one process, as LD_PRELOAD shim of the fault harness.
 *
 * What a host whose clock is wrong looks like to a program: CLOCK_REALTIME (and its _COARSE
 * and TAI variants), gettimeofday() and time() read a skew off the true time; CLOCK_MONOTONIC,
 * CLOCK_BOOTTIME and every sleep and timer are untouched, because a wrong wall clock does not
 * change how long a second lasts. libfaketime cannot stand in: it also moves absolute timerfd
 * deadlines on CLOCK_BOOTTIME, so a program that sleeps on them stops waking up.
 *
 * The skew, in seconds (decimal, may be negative, up to 9 fraction digits):
 *   - $SKEW_FILE: a file holding it. It is looked at on every wall-clock read and read again
 *     when its inode, size or mtime changed, so the harness can step a running process's clock
 *     by writing a new file and renaming it over the old one. A missing, unreadable or
 *     malformed file means no skew (0), at once.
 *   - else $SKEW_SECONDS (read once, at load).
 *
 * Safe from any thread and from signal handlers: the file is read with open/read (no stdio,
 * no malloc) under a try-lock; a reader that finds the lock taken uses the last value read.
 * Works only on dynamically linked programs (a static binary ignores LD_PRELOAD).
 * Absolute CLOCK_REALTIME sleeps (clock_nanosleep TIMER_ABSTIME, timer_settime ABSTIME) are not
 * translated: a program that computes such a deadline from its skewed clock sleeps the skew
 * longer or shorter than a real host would.
 *
 *   gcc -shared -fPIC -O2 -Wall -o skew.so skew.c -ldl -lpthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S 1000000000LL

/* glibc declares the pointers nonnull; a caller may still pass NULL, which must not crash. */
#pragma GCC diagnostic ignored "-Wnonnull-compare"

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;

static const char *skew_file;        /* $SKEW_FILE, or NULL */
static int64_t env_skew_ns;          /* $SKEW_SECONDS */
static int64_t file_skew_ns;         /* last value read from the file (atomic access) */
static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {                      /* what the file looked like when last read */
    int valid;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} seen;

/* "[-+]digits[.digits]" in seconds -> nanoseconds; 0 for anything else. */
static int64_t parse_seconds(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    int negative = 0;
    if (i < n && (s[i] == '-' || s[i] == '+')) negative = s[i++] == '-';
    int64_t whole = 0, frac = 0, scale = NS_PER_S;
    int digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        if (whole > INT64_MAX / 10 / NS_PER_S) return 0;   /* beyond 292 years: nonsense */
        whole = whole * 10 + (s[i++] - '0');
        digits++;
    }
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (scale > 1) {
                scale /= 10;
                frac += (s[i] - '0') * scale;
            }
            i++;
            digits++;
        }
    }
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    if (digits == 0 || i != n) return 0;
    int64_t ns = whole * NS_PER_S + frac;
    return negative ? -ns : ns;
}

__attribute__((constructor)) static void skew_init(void) {
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    real_gettimeofday = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    const char *file = getenv("SKEW_FILE");
    skew_file = (file && *file) ? file : NULL;
    const char *seconds = getenv("SKEW_SECONDS");
    if (seconds) {
        size_t n = 0;
        while (seconds[n]) n++;
        env_skew_ns = parse_seconds(seconds, n);
    }
}

/* The file's skew, read again only when the file changed. */
static int64_t skew_from_file(void) {
    if (pthread_mutex_trylock(&file_lock) != 0)
        return __atomic_load_n(&file_skew_ns, __ATOMIC_RELAXED);
    int64_t value;
    struct stat st;
    if (stat(skew_file, &st) != 0) {
        seen.valid = 0;
        value = 0;
    } else if (seen.valid && st.st_dev == seen.dev && st.st_ino == seen.ino &&
               st.st_size == seen.size && st.st_mtim.tv_sec == seen.mtime.tv_sec &&
               st.st_mtim.tv_nsec == seen.mtime.tv_nsec) {
        value = __atomic_load_n(&file_skew_ns, __ATOMIC_RELAXED);
    } else {
        char buf[64];
        ssize_t n = -1;
        int fd = open(skew_file, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            n = read(fd, buf, sizeof buf);
            close(fd);
        }
        /* Too long to be a number (n == sizeof buf) counts as malformed. */
        value = (n > 0 && (size_t)n < sizeof buf) ? parse_seconds(buf, (size_t)n) : 0;
        seen.valid = n >= 0;
        seen.dev = st.st_dev;
        seen.ino = st.st_ino;
        seen.size = st.st_size;
        seen.mtime = st.st_mtim;
    }
    __atomic_store_n(&file_skew_ns, value, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&file_lock);
    return value;
}

static int64_t skew_ns(void) {
    return skew_file ? skew_from_file() : env_skew_ns;
}

static int is_wall_clock(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

/* Move (sec, nsec) by skew nanoseconds, keeping 0 <= nsec < 1e9. */
static void shift(time_t *sec, long *nsec, int64_t skew) {
    int64_t total_nsec = (int64_t)*nsec + skew % NS_PER_S;
    int64_t s = (int64_t)*sec + skew / NS_PER_S;
    if (total_nsec < 0) {
        total_nsec += NS_PER_S;
        s -= 1;
    } else if (total_nsec >= NS_PER_S) {
        total_nsec -= NS_PER_S;
        s += 1;
    }
    *sec = (time_t)s;
    *nsec = (long)total_nsec;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) skew_init();
    int r = real_clock_gettime(id, ts);
    if (r == 0 && ts && is_wall_clock(id)) {
        int64_t skew = skew_ns();
        if (skew) shift(&ts->tv_sec, &ts->tv_nsec, skew);
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    if (!real_gettimeofday) skew_init();
    int r = real_gettimeofday(tv, tz);
    if (r == 0 && tv) {
        int64_t skew = skew_ns();
        if (skew) {
            long nsec = (long)tv->tv_usec * 1000;
            shift(&tv->tv_sec, &nsec, skew);
            tv->tv_usec = (suseconds_t)(nsec / 1000);
        }
    }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
