// The addon's export list, and nothing else.
#include <napi.h>

#include "glue_misc.h"
#include "glue_model.h"
#include "glue_traces.h"
#include "nccl_glue.h"

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("NativeModel", rls::ModelWrap::Init(env));
  exports.Set("sgemmGflops", Napi::Function::New(env, rls::SgemmGflops));
  exports.Set("crc32", Napi::Function::New(env, rls::Crc32));
  exports.Set("sealFrames", Napi::Function::New(env, rls::SealFrames));
  exports.Set("checkFrames", Napi::Function::New(env, rls::CheckFrames));
  exports.Set("transcode", Napi::Function::New(env, rls::Transcode));
  exports.Set("nativeBlock", Napi::Function::New(env, rls::NativeBlock));
  exports.Set("writeNativeBlock", Napi::Function::New(env, rls::WriteNativeBlock));
  exports.Set("cudaAvailable", Napi::Function::New(env, rls::CudaAvailable));
  exports.Set("cudaMemory", Napi::Function::New(env, rls::CudaMemory));
  rls::InitNccl(env, exports);
#ifdef RLSTREAM_CUDA
  exports.Set("backend", Napi::String::New(env, "cpu+cuda"));
#else
  exports.Set("backend", Napi::String::New(env, "cpu"));
#endif
  return exports;
}

NODE_API_MODULE(rlstream_native, Init)
