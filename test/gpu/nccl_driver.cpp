// The NCCL layer of the native core (native/src/nccl_core.cpp) on a GPU machine without Node: the library loaded at
// run time, one rank on GPU 0 running each collective on fp32 and bf16 host buffers (with one rank every result is
// the input, so any staging or type error shows), counts that do not fit refused before NCCL runs, and the time of
// one host-staged all-reduce of a 25 MiB bucket. Prints one JSON line; exit 0 when every check held, 2 when NCCL
// or a GPU is missing (the line says which), 1 when a check failed.
//   bash test/gpu/nccl.sh   (builds this with g++ against the CUDA runtime, finds libnccl.so.2, runs it)
#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../../native/src/errors.h"
#include "../../native/src/nccl_core.h"

using namespace rls;

static int failures = 0;
static std::string checks;

static void expect(bool ok, const std::string& what) {
  if (!ok) failures++;
  checks += (checks.empty() ? "" : ",") + std::string("{\"check\":\"") + what + "\",\"ok\":" + (ok ? "true" : "false") + "}";
}

static bool refuses(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const NativeError& e) {
    return std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

int main() {
  const NcclStatusInfo s = nccl_status();
  if (!s.error.empty()) {
    std::printf("{\"nccl\":null,\"library\":\"%s\",\"error\":\"%s\"}\n", s.library.c_str(), s.error.c_str());
    return 2;
  }
  uint8_t id[128];
  nccl_unique_id(id);
  int comm = 0;
  try {
    comm = nccl_comm_init(id, 1, 0, 0);
  } catch (const NativeError& e) {
    std::printf("{\"nccl\":%d,\"error\":\"%s\"}\n", s.version, e.what());
    return 2;
  }
  const size_t n = 1003;  // odd, not a multiple of any vector width
  std::vector<float> f(n), g(n);
  for (size_t i = 0; i < n; i++) f[i] = (float)i * 0.37f - 100.f;
  g = f;
  nccl_run(comm, NcclOp::AllReduce, NcclType::F32, g.data(), n, g.data(), n, 0);
  expect(g == f, "allReduce fp32, 1 rank: the input");
  std::vector<uint16_t> b(n), b0;
  for (size_t i = 0; i < n; i++) b[i] = (uint16_t)(0x3f80 + (i % 200));  // bf16 bit patterns around 1.0
  b0 = b;
  nccl_run(comm, NcclOp::AllReduce, NcclType::BF16, b.data(), n, b.data(), n, 0);
  expect(b == b0, "allReduce bf16, 1 rank: the input");
  g = f;
  nccl_run(comm, NcclOp::Broadcast, NcclType::F32, g.data(), n, g.data(), n, 0);
  expect(g == f, "broadcast from rank 0");
  std::vector<float> out(n, 0.f);
  nccl_run(comm, NcclOp::AllGather, NcclType::F32, f.data(), n, out.data(), n, 0);
  expect(out == f, "allGather, 1 rank");
  std::fill(out.begin(), out.end(), 0.f);
  nccl_run(comm, NcclOp::ReduceScatter, NcclType::F32, f.data(), n, out.data(), n, 0);
  expect(out == f, "reduceScatter, 1 rank");
  expect(refuses([&] { nccl_check(comm, NcclOp::AllGather, n, n + 1, 0); }, "allGather: recv has 1004 elements"), "allGather with the wrong recv count refused");
  expect(refuses([&] { nccl_check(comm, NcclOp::Broadcast, n, n, 1); }, "broadcast: root 1 is not a rank of 1"), "broadcast from a rank not in the group refused");
  expect(refuses([&] { nccl_comm_init(id, 2, 2, 0); }, "rank 2 is not in [0, 2)"), "a rank outside the group refused");
  // one 25 MiB fp32 bucket (PyTorch DDP's default bucket_cap_mb), host -> GPU -> NCCL -> host, best of 5
  std::vector<float> big(25u * 1024 * 1024 / 4, 1.f);
  double best = 1e9;
  for (int k = 0; k < 5; k++) {
    auto t0 = std::chrono::steady_clock::now();
    nccl_run(comm, NcclOp::AllReduce, NcclType::F32, big.data(), big.size(), big.data(), big.size(), 0);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  expect(big[12345] == 1.f, "allReduce of 25 MiB, 1 rank: the input");
  nccl_comm_destroy(comm, false);
  expect(refuses([&] { nccl_run(comm, NcclOp::AllReduce, NcclType::F32, f.data(), n, f.data(), n, 0); }, "is not an open NCCL communicator"), "a destroyed communicator refused");
  std::printf("{\"nccl\":%d,\"library\":\"%s\",\"allreduce_25mib_1rank_host_staged_ms\":%.3f,\"failures\":%d,\"checks\":[%s]}\n", s.version, s.library.c_str(), best, failures, checks.c_str());
  return failures == 0 ? 0 : 1;
}
