/* A tiny static HTTP responder for the node test (tests/node.rs): `hello PORT` listens on
 * 127.0.0.1:PORT (pods of the bed's node use the host network) and answers every request with
 * what the container sees of itself: uid, whether / is read-only, its effective capabilities,
 * its seccomp mode and the service-account files in-cluster config reads. GET /ready answers
 * 200 only when those files are there (the readiness probe), anything else 200 with the report.
 * `hello check` exits 0 when the files are there (for kubectl exec). SIGTERM ends it. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define SA "/var/run/secrets/kubernetes.io/serviceaccount/"
static const char *files[] = {SA "token", SA "ca.crt", SA "namespace"};

static long file_size(const char *path) {
  struct stat st;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  long n = fstat(fd, &st) == 0 ? (long)st.st_size : -1;
  close(fd);
  return n;
}

static int files_ok(void) {
  for (unsigned i = 0; i < sizeof files / sizeof *files; i++)
    if (file_size(files[i]) <= 0) return 0;
  return 1;
}

/* the value of one "Key:\t..." line of /proc/self/status */
static void status_field(const char *key, char *out, size_t n) {
  char line[256];
  size_t k = strlen(key);
  snprintf(out, n, "?");
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, k) == 0 && line[k] == ':') {
      char *v = line + k + 1;
      while (*v == ' ' || *v == '\t') v++;
      v[strcspn(v, "\n")] = 0;
      snprintf(out, n, "%s", v);
      break;
    }
  fclose(f);
}

static int report(char *buf, size_t n) {
  char caps[64], seccomp[16];
  status_field("CapEff", caps, sizeof caps);
  status_field("Seccomp", seccomp, sizeof seccomp);
  int fd = open("/.hello-write-test", O_WRONLY | O_CREAT, 0600);
  const char *rootfs = fd < 0 && errno == EROFS ? "read-only" : "writable";
  if (fd >= 0) close(fd);
  int len = snprintf(buf, n, "uid=%d\ngid=%d\nrootfs=%s\ncapeff=%s\nseccomp=%s\n", (int)getuid(),
                     (int)getgid(), rootfs, caps, seccomp);
  for (unsigned i = 0; i < sizeof files / sizeof *files; i++)
    len += snprintf(buf + len, n - len, "%s=%ld\n", files[i], file_size(files[i]));
  return len;
}

static void stop(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "check") == 0) {
    char buf[2048];
    fwrite(buf, 1, report(buf, sizeof buf), stdout);
    return files_ok() ? 0 : 1;
  }
  if (argc != 2) {
    fprintf(stderr, "usage: hello PORT | hello check\n");
    return 2;
  }
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  signal(SIGPIPE, SIG_IGN);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16)) {
    perror("hello: listen");
    return 1;
  }
  printf("hello: listening on 127.0.0.1:%s\n", argv[1]);
  fflush(stdout);
  for (;;) {
    int c = accept(s, 0, 0);
    if (c < 0) continue;
    char req[1024] = {0}, body[2048], head[256];
    ssize_t r = read(c, req, sizeof req - 1);
    (void)r;
    int ready_path = strncmp(req, "GET /ready ", 10) == 0;
    int len = report(body, sizeof body);
    int code = ready_path && !files_ok() ? 503 : 200;
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n",
                      code, code == 200 ? "OK" : "Service Unavailable", len);
    if (write(c, head, hl) == hl) {
      ssize_t w = write(c, body, len);
      (void)w;
    }
    close(c);
  }
}
