/* The bed's web server (testbed/workloads, image testbed.invalid/web): `web [PORT]` listens on
 * every address of its pod (default port 8080) and answers
 *   GET /ready  200 "ready" while serving, 503 once terminating or switched off (the readiness
 *               probe);
 *   GET /readiness/off, /readiness/on
 *               200: /ready answers 503 from now on (or 200 again, unless terminating); the
 *               data-path benchmark flips a pod's readiness this way (tests/bench_datapath.rs);
 *   GET /exit   no answer: the process exits at once with status 137, as if killed (SIGKILL,
 *               an OOM kill); the kubelet restarts it in the same pod (tests/locality.rs);
 *   anything    200 "pod=<POD_NAME> cluster=<CLUSTER> path=<PATH>\n" (env from the pod spec).
 * Graceful termination, like a preStop hook: after SIGTERM it reports not ready but keeps
 * serving for GRACE_SECONDS (default 5), then exits 0. One connection at a time, HTTP/1.0,
 * each closed after its answer. Logs one line per event to stdout (`kubectl logs`). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t term;
static int unready; /* switched off by GET /readiness/off */

static void on_term(int sig) {
  (void)sig;
  term = 1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static const char *env_or(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return v && *v ? v : dflt;
}

static void answer(int fd, int terminating) {
  char req[2048], path[256] = "/", body[512], out[1024];
  struct timeval tv = {2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ssize_t n = recv(fd, req, sizeof req - 1, 0);
  if (n <= 0) return;
  req[n] = 0;
  sscanf(req, "%*s %255s", path);
  int code = 200;
  if (strcmp(path, "/exit") == 0) {
    printf("web: exit requested: exiting at once (137)\n");
    _exit(137);
  }
  if (strcmp(path, "/ready") == 0) {
    code = terminating || unready ? 503 : 200;
    snprintf(body, sizeof body, "%s\n",
             terminating ? "terminating" : unready ? "switched off" : "ready");
  } else if (strcmp(path, "/readiness/off") == 0 || strcmp(path, "/readiness/on") == 0) {
    unready = strcmp(path, "/readiness/off") == 0;
    printf("web: readiness %s\n", unready ? "off" : "on");
    snprintf(body, sizeof body, "readiness %s\n", unready ? "off" : "on");
  } else {
    snprintf(body, sizeof body, "pod=%s cluster=%s path=%s\n", env_or("POD_NAME", "?"),
             env_or("CLUSTER", "?"), path);
  }
  int len = snprintf(out, sizeof out,
                     "HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     code, code == 200 ? "OK" : "Service Unavailable", strlen(body), body);
  if (send(fd, out, (size_t)len, MSG_NOSIGNAL) < 0) perror("web: send");
}

int main(int argc, char **argv) {
  int port = argc > 1 ? atoi(argv[1]) : 8080;
  double grace = atof(env_or("GRACE_SECONDS", "5"));
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct sigaction sa = {0};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 128) < 0) {
    perror("web: listen");
    return 1;
  }
  printf("web: %s of %s listening on port %d\n", env_or("POD_NAME", "?"), env_or("CLUSTER", "?"),
         port);
  double until = 0;
  for (;;) {
    if (term && until == 0) {
      until = now() + grace;
      printf("web: SIGTERM, serving %.1fs more\n", grace);
    }
    if (until > 0 && now() >= until) break;
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0) continue;
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;
    answer(c, until > 0);
    close(c);
  }
  printf("web: exiting\n");
  return 0;
}
