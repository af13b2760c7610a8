// Request ids: what ties a client's request to the server's log lines about it.
#ifndef DRAY_BASE_REQUEST_ID_H_
#define DRAY_BASE_REQUEST_ID_H_

#include <string>

namespace dray {

// NewRequestId: 16 random hex digits.
std::string NewRequestId();

}  // namespace dray

#endif  // DRAY_BASE_REQUEST_ID_H_
