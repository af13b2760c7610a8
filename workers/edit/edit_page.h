// kEditPage: the page dray serve's HTTP port shows at / (HttpGateway): pick
// pictures, type an instruction, watch the denoising steps as they run (the
// stream of POST /v1/images/edits) and get the edited image, or the error
// that refused it. One HTML file with its style and script, no dependency.
#ifndef DRAY_WORKERS_EDIT_EDIT_PAGE_H_
#define DRAY_WORKERS_EDIT_EDIT_PAGE_H_

namespace dray {

extern const char kEditPage[];

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_EDIT_PAGE_H_
