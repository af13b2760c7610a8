// kTrainPage: the page dray train's HTTP port shows at / (TrainDashboard):
// the run's progress, its curves (reward, loss, images/s, phase times)
// redrawn every 2 s as steps finish, the newest sample grid, the
// checkpoints and the configuration. One HTML file with its style and
// script, no dependency.
#ifndef DRAY_WORKERS_TRAIN_TRAIN_PAGE_H_
#define DRAY_WORKERS_TRAIN_TRAIN_PAGE_H_

namespace dray {

extern const char kTrainPage[];

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRAIN_PAGE_H_
