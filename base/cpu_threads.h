// How many threads one process's tensor work uses on the CPU, for code that
// runs several ranks as threads of one process (a benchmark, a test group):
// each rank should then compute on one core, as a worker process does when
// its group hands it its share of the machine (OMP_NUM_THREADS).
//
//   UseOneCpuThreadPerCaller();  // before the ranks start
//
// Thread-safe.
#ifndef DRAY_BASE_CPU_THREADS_H_
#define DRAY_BASE_CPU_THREADS_H_

namespace dray {

// UseOneCpuThreadPerCaller makes LibTorch's intra-op parallelism and the BLAS
// it calls (OpenBLAS's own thread pool, which at::set_num_threads does not
// reach and which otherwise keeps the count it read at load from
// OPENBLAS_NUM_THREADS or OMP_NUM_THREADS) use one thread: the calling
// thread. Threads started later start with OpenMP's default, so a rank
// thread calls it too.
void UseOneCpuThreadPerCaller();

}  // namespace dray

#endif  // DRAY_BASE_CPU_THREADS_H_
