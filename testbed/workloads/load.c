/* The bed's load client (testbed/workloads, image testbed.invalid/load).
 *   load get URL...       one GET per URL, in turn (curl-like, for kubectl exec): prints each
 *                         body; exits 0 when every answer is 2xx, otherwise 1, with one line
 *                         "load: <URL>: <why>" on stderr per failure
 *   load run URL [RATE]   RATE requests a second (default 10) until killed, each started on
 *                         schedule on a thread of its own (open loop: a slow answer delays no
 *                         other request), each on a new connection whose host name is
 *                         resolved anew (the pod's resolv.conf),
 *                         one stdout line per request as it ends, for a test to parse from the
 *                         pod's logs (seq: the request's number from 0, in the order they
 *                         began; sent: when it began, unix ms; took: ms until its answer or
 *                         failure, name resolution included):
 *                           <seq> <sent> <took> ok <status> <first line of the body>
 *                           <seq> <sent> <took> fail <why>
 *                         (a connect that failed after its SYN names its local port: "connect:
 *                         Connection timed out (port 40312)"); each connection of a run from a
 *                         local port no earlier one of it used (see bind_fresh)
 *                         Lines come in the order requests end: every request begun before a
 *                         time T has its line once every seq below that of a line sent at or
 *                         after T is there.
 *   load idle             waits until killed (a pod to `kubectl exec` into)
 *   load resolve HOST     the IPv4 addresses the pod's resolver gives for HOST (as `dig` would
 *                         show them, through resolv.conf), one a line, sorted; exit 1 if none
 * URL is http://HOST[:PORT][/PATH]; connect and answer each have a 2 s deadline. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct url {
  char host[256], port[8], path[512];
};

static int parse_url(const char *s, struct url *u) {
  if (strncmp(s, "http://", 7) != 0) return -1;
  s += 7;
  size_t h = strcspn(s, ":/");
  if (h == 0 || h >= sizeof u->host) return -1;
  memcpy(u->host, s, h);
  u->host[h] = 0;
  s += h;
  snprintf(u->port, sizeof u->port, "80");
  if (*s == ':') {
    size_t p = strcspn(++s, "/");
    if (p == 0 || p >= sizeof u->port) return -1;
    memcpy(u->port, s, p);
    u->port[p] = 0;
    s += p;
  }
  snprintf(u->path, sizeof u->path, "%s", *s ? s : "/");
  return 0;
}

/* the local port of fd, for a failed connect to name its flow (a node's conntrack entry) */
static int local_port(int fd) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  return getsockname(fd, (struct sockaddr *)&a, &len) == 0 ? ntohs(a.sin_port) : 0;
}

/* The next local port to try (a counter from a start that differs between processes).
 * Every connection of a run takes a port no earlier connection of it took: the kernel may
 * otherwise give a port again seconds after a connect through it timed out, and its node's
 * conntrack still holds that attempt's flow (SYN_SENT, unanswered, 120 s): the new SYN is
 * taken for a retransmission and follows the old flow's DNAT, to an endpoint kube-proxy has
 * since removed (it flushes UDP flows of removed endpoints, not TCP ones). A real client meets
 * that too, with an in-cluster Service as with ours; a test of what kube-proxy does for new
 * connections must not. */
static unsigned next_port;
#define PORTS_FROM 15000
#define PORTS 30000

/* binds fd to a local port this process has not used before (within PORTS of them) */
static int bind_fresh(int fd) {
  for (int tries = 0; tries < 256; tries++) {
    unsigned k = __atomic_fetch_add(&next_port, 1, __ATOMIC_RELAXED);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    a.sin_port = htons((unsigned short)(PORTS_FROM + k % PORTS));
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0) return 0;
    if (errno != EADDRINUSE) return -1;
  }
  return -1;
}

/* connect with a deadline, from a fresh local port; on failure, why says so (and from which
 * local port) */
static int dial(const struct url *u, char *why, size_t n) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
  int rc = getaddrinfo(u->host, u->port, &hints, &ai);
  if (rc != 0) {
    snprintf(why, n, "resolve %s: %s", u->host, gai_strerror(rc));
    return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd >= 0 && bind_fresh(fd) < 0) {
    snprintf(why, n, "bind: %s", strerror(errno));
    freeaddrinfo(ai);
    close(fd);
    return -1;
  }
  if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)) {
    snprintf(why, n, "connect: %s", strerror(errno));
    freeaddrinfo(ai);
    if (fd >= 0) close(fd);
    return -1;
  }
  freeaddrinfo(ai);
  int port = local_port(fd); /* bound by connect, before a failure may unbind it */
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int err = 0;
  socklen_t len = sizeof err;
  if (poll(&p, 1, 2000) != 1) err = ETIMEDOUT;
  else getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    snprintf(why, n, "connect: %s (port %d)", strerror(err), port);
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, 0);
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* one GET: the status code (and the body in body), or -1 with why */
static int get(const struct url *u, char *body, size_t bn, char *why, size_t wn) {
  int fd = dial(u, why, wn);
  if (fd < 0) return -1;
  char buf[8192];
  int len = snprintf(buf, sizeof buf, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: load\r\n\r\n",
                     u->path, u->host);
  if (send(fd, buf, (size_t)len, MSG_NOSIGNAL) != len) {
    snprintf(why, wn, "send: %s", strerror(errno));
    close(fd);
    return -1;
  }
  size_t got = 0;
  ssize_t r = 0;
  while (got < sizeof buf - 1 && (r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0)
    got += (size_t)r;
  int e = r < 0 ? errno : 0; /* errno is stale (EINPROGRESS of the connect) after an orderly close */
  close(fd);
  buf[got] = 0;
  int code;
  if (sscanf(buf, "HTTP/%*s %d", &code) != 1) {
    snprintf(why, wn, "no HTTP answer (%s)", got ? "garbled" : e ? strerror(e) : "closed");
    return -1;
  }
  char *b = strstr(buf, "\r\n\r\n");
  snprintf(body, bn, "%s", b ? b + 4 : "");
  return code;
}

static long long unix_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* one request of `run`, on a thread of its own */
struct shot {
  const struct url *u;
  long long seq, sent;
};

static void *fire(void *arg) {
  struct shot *s = arg;
  char body[4096], why[512];
  int code = get(s->u, body, sizeof body, why, sizeof why);
  long long took = unix_ms() - s->sent;
  body[strcspn(body, "\r\n")] = 0;
  /* one printf per record: stdio locks the stream, so lines of threads never mix */
  if (code >= 0) printf("%lld %lld %lld ok %d %s\n", s->seq, s->sent, took, code, body);
  else printf("%lld %lld %lld fail %s\n", s->seq, s->sent, took, why);
  free(s);
  return NULL;
}

/* Open loop: each request starts on its own thread at its scheduled time, whatever the ones
 * before it are doing, so a request that hangs until its deadline delays no other and the
 * count sent in a window is RATE x its length (a client that waited for each answer would send
 * fewer requests exactly when the path is broken). */
static void run(const struct url *u, double rate) {
  struct timespec next;
  clock_gettime(CLOCK_MONOTONIC, &next);
  long step = (long)(1e9 / rate);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (long long seq = 0;; seq++) {
    struct shot *s = malloc(sizeof *s);
    pthread_t t;
    if (s) {
      s->u = u;
      s->seq = seq;
      s->sent = unix_ms();
    }
    if (!s || pthread_create(&t, &attr, fire, s) != 0) {
      printf("%lld %lld 0 fail client: cannot start a request\n", seq, unix_ms());
      free(s);
    }
    next.tv_nsec += step;
    while (next.tv_nsec >= 1000000000L) {
      next.tv_nsec -= 1000000000L;
      next.tv_sec++;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
  }
}

/* as a pod's first process it has no default action for SIGTERM: end at once */
static void on_term(int sig) { _exit(128 + sig); }

static int by_text(const void *a, const void *b) { return strcmp(a, b); }

/* every IPv4 address of host, one a line, sorted and without repeats */
static int resolve(const char *host) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai, *p;
  int rc = getaddrinfo(host, NULL, &hints, &ai);
  if (rc != 0) {
    fprintf(stderr, "load: %s: %s\n", host, gai_strerror(rc));
    return 1;
  }
  char seen[64][INET_ADDRSTRLEN];
  size_t n = 0;
  for (p = ai; p && n < 64; p = p->ai_next) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)p->ai_addr;
    inet_ntop(AF_INET, &in->sin_addr, seen[n], INET_ADDRSTRLEN);
    n++;
  }
  freeaddrinfo(ai);
  qsort(seen, n, INET_ADDRSTRLEN, by_text);
  for (size_t i = 0; i < n; i++)
    if (i == 0 || strcmp(seen[i], seen[i - 1]) != 0) puts(seen[i]);
  return n ? 0 : 1;
}

int main(int argc, char **argv) {
  struct url u;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  next_port = (unsigned)(now.tv_nsec ^ ((long)getpid() << 8)) % PORTS;
  if (argc == 2 && strcmp(argv[1], "idle") == 0) {
    for (;;) pause();
  }
  if (argc == 3 && strcmp(argv[1], "resolve") == 0) return resolve(argv[2]);
  if (argc < 3 || parse_url(argv[2], &u) != 0 ||
      (strcmp(argv[1], "get") != 0 && strcmp(argv[1], "run") != 0)) {
    fprintf(stderr, "usage: load get URL... | load run URL [RATE] | load idle | load resolve HOST   (URL: http://HOST[:PORT][/PATH])\n");
    return 2;
  }
  if (strcmp(argv[1], "run") == 0) {
    double rate = argc > 3 ? atof(argv[3]) : 10;
    run(&u, rate > 0 ? rate : 10);
    return 0;
  }
  /* one GET per URL, one after another (tests/locality.rs kills several pods at one instant) */
  int failed = 0;
  for (int i = 2; i < argc; i++) {
    char body[4096], why[512];
    if (parse_url(argv[i], &u) != 0) {
      fprintf(stderr, "load: %s: not http://HOST[:PORT][/PATH]\n", argv[i]);
      return 2;
    }
    int code = get(&u, body, sizeof body, why, sizeof why);
    if (code < 0) {
      fprintf(stderr, "load: %s: %s\n", argv[i], why);
      failed = 1;
      continue;
    }
    fputs(body, stdout);
    if (code < 200 || code > 299) {
      fprintf(stderr, "load: %s: HTTP %d\n", argv[i], code);
      failed = 1;
    }
  }
  return failed;
}
