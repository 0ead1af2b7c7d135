/*
 * A tiny pause binary for the registry.k8s.io/pause:3.10 image that
 * hack/images.sh builds (no registry here). Same job as Kubernetes' pause:
 * hold the pod sandbox's namespaces, reap zombies, exit on INT/TERM.
 * Built with `gcc -static -Os` so the image needs nothing else.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int signo) { _exit(0); }

static void sigreap(int signo) {
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

int main(void) {
  struct sigaction down = {.sa_handler = sigdown};
  struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
      sigaction(SIGCHLD, &reap, NULL) < 0)
    return 1;
  for (;;)
    pause();
}
