/* The sandbox ("pause") image of the test bed's node: holds a pod's namespaces, reaps the
 * zombies of a shared PID namespace, exits on SIGTERM/SIGINT. Built with gcc -static, packaged
 * from scratch by testbed/bed (no registry here). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction s = {0};
  s.sa_handler = stop;
  sigaction(SIGTERM, &s, 0);
  sigaction(SIGINT, &s, 0);
  s.sa_handler = reap;
  s.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &s, 0);
  for (;;) pause();
}
