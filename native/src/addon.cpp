// The addon's export list, and nothing else.
#include <napi.h>

#include "glue_misc.h"
#include "glue_model.h"

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("NativeModel", rls::ModelWrap::Init(env));
  exports.Set("sgemmGflops", Napi::Function::New(env, rls::SgemmGflops));
  exports.Set("cudaAvailable", Napi::Function::New(env, rls::CudaAvailable));
#ifdef RLSTREAM_CUDA
  exports.Set("backend", Napi::String::New(env, "cpu+cuda"));
#else
  exports.Set("backend", Napi::String::New(env, "cpu"));
#endif
  return exports;
}

NODE_API_MODULE(rlstream_native, Init)
