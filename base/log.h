// Log: how every dray process tells the person at the terminal what it is
// doing: one line on stderr, "dray COMPONENT: MESSAGE", the component being
// who speaks (the controller, a node, a worker rank, `dray train`, ...).
//
//   Log("controller", absl::StrCat("node ", name, " attached"));
//   Log(absl::StrFormat("worker rank %d (pid %d)", rank, getpid()), "exiting");
//
// Each line is written whole and at once, so that lines from the threads of
// one process, and from workers whose output the controller forwards, never
// interleave inside a line. Progress bars and reports that redraw or span
// lines (`dray train`'s bar, `dray edit`'s denoising steps) write their own.
//
// Thread-safe.
#ifndef DRAY_BASE_LOG_H_
#define DRAY_BASE_LOG_H_

#include "absl/strings/string_view.h"

namespace dray {

// Log writes "dray COMPONENT: MESSAGE\n" to stderr in one write.
void Log(absl::string_view component, absl::string_view message);

}  // namespace dray

#endif  // DRAY_BASE_LOG_H_
