// SIGINT and SIGTERM, the signals that ask a dray process to stop, taken
// synchronously: block them in every thread at the start of main(), then
// wait for one where the process can act on it.
//
//   int main() {
//     BlockStopSignals();                 // before any thread starts
//     ... start servers ...
//     const int signal = WaitForStopSignal();
//     ... shut down cleanly ...
//   }
//
// Thread-safety: BlockStopSignals affects the calling thread and the threads
// it starts afterwards; WaitForStopSignal may be called from any thread.
#ifndef DRAY_BASE_STOP_SIGNALS_H_
#define DRAY_BASE_STOP_SIGNALS_H_

namespace dray {

// BlockStopSignals blocks SIGINT and SIGTERM in the calling thread (and so in
// every thread it starts later), leaving them for WaitForStopSignal.
void BlockStopSignals();

// WaitForStopSignal waits until SIGINT or SIGTERM arrives and returns it.
int WaitForStopSignal();

// WaitForStopSignal(timeout_ms) waits at most `timeout_ms` milliseconds;
// 0 when no stop signal arrived.
int WaitForStopSignal(int timeout_ms);

}  // namespace dray

#endif  // DRAY_BASE_STOP_SIGNALS_H_
