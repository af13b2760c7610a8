#include "base/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace dray {
namespace {

sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

}  // namespace

void BlockStopSignals() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForStopSignal() {
  const sigset_t signals = StopSignals();
  int signal = 0;
  sigwait(&signals, &signal);
  return signal;
}

int WaitForStopSignal(int timeout_ms) {
  const sigset_t signals = StopSignals();
  const timespec timeout = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  const int signal = sigtimedwait(&signals, nullptr, &timeout);
  return signal > 0 ? signal : 0;
}

}  // namespace dray
