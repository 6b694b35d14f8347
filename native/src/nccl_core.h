// NCCL loaded at run time, without N-API (nccl_core.cpp): the library's status, communicators by handle, and the
// four collectives over host buffers staged through the communicator's GPU. The N-API glue is nccl.cpp; the GPU
// check test/gpu/nccl_driver.cpp drives this directly on a machine without Node.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace rls {

struct NcclStatusInfo {
  std::string library;  // what dlopen was asked for
  int version = 0;      // NCCL's integer version where it loaded, else 0
  std::string error;    // why communicators cannot be made here; empty when they can
};
NcclStatusInfo nccl_status();

enum class NcclOp { AllReduce, Broadcast, AllGather, ReduceScatter };
enum class NcclType { F32, BF16 };

// 128 bytes; throws NativeError naming what is missing where NCCL is not usable.
void nccl_unique_id(uint8_t out[128]);
// Blocks until all `ranks` joined. Returns a handle for the calls below.
int nccl_comm_init(const uint8_t id[128], int ranks, int rank, int device);
void nccl_comm_destroy(int comm, bool abort);
int nccl_comm_size(int comm);
// Host buffers: send (send_count elements) and recv (recv_count); for AllReduce and Broadcast recv is send.
// Checks the counts against the operation and the group's size before anything runs.
void nccl_check(int comm, NcclOp op, size_t send_count, size_t recv_count, int root);
void nccl_run(int comm, NcclOp op, NcclType type, const void* send, size_t send_count, void* recv, size_t recv_count, int root);
// Device buffers of the communicator's GPU (a model's block_data), queued on `queue` (Model::queue(): the stream
// its kernels run on) without waiting: the collective runs after the kernels queued before it and before those
// queued after it, with no copy through the host. In place where send and recv overlap as NCCL allows (AllReduce
// and Broadcast: the same buffer; AllGather: send at recv + rank x send_count; ReduceScatter: recv at send + rank x
// recv_count).
void nccl_run_device(int comm, NcclOp op, NcclType type, const void* send, size_t send_count, void* recv, size_t recv_count,
                     int root, void* queue);

}  // namespace rls
