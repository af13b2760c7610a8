// Parity with DMD2 (tianweiy/DMD2): the cases of a folder laid out like
// tests/data/reference/dmd2, run through rl/dmd2.h around the reference's
// toy score models (re-made here from cases.json's parameters): the
// distribution-matching loss with its gradient and the real score's CFG,
// the fake score's denoising loss, the GAN losses of generator and
// classifier (with and without diffusion GAN noise), and the generator's
// backward simulation with its pure-noise rows. Every random draw is the
// reference's, read from the case.
//
//   for (const ParityCase& c : Dmd2ParityCases("tests/data/reference/dmd2")) ...
#ifndef DRAY_WORKERS_PARITY_DMD2_PARITY_H_
#define DRAY_WORKERS_PARITY_DMD2_PARITY_H_

#include <string>
#include <vector>

#include "workers/parity/parity_case.h"

namespace dray::rl {

// Dmd2ParityCases lists the cases of `folder`, in cases.json's order (none
// if the folder is not a DMD2 reference).
std::vector<ParityCase> Dmd2ParityCases(const std::string& folder);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_PARITY_DMD2_PARITY_H_
