// NCCL loaded at run time (nccl.cpp): the addon's `nccl` object and cudaDeviceCount.
#pragma once
#include <napi.h>

namespace rls {
void InitNccl(Napi::Env env, Napi::Object exports);
}
