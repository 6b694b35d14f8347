// N-API glue for process-level helpers (declarations).
#pragma once
#include <napi.h>

namespace rls {
Napi::Value SgemmGflops(const Napi::CallbackInfo& info);
Napi::Value CudaAvailable(const Napi::CallbackInfo& info);
Napi::Value CudaMemory(const Napi::CallbackInfo& info);
Napi::Value CheckFrames(const Napi::CallbackInfo& info);
Napi::Value Crc32(const Napi::CallbackInfo& info);
Napi::Value SealFrames(const Napi::CallbackInfo& info);
}
