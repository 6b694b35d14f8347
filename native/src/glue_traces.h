// N-API glue for the trace sink's Avro → RowBinary transcoder and RowBinary → Native blocks (declarations).
#pragma once
#include <napi.h>

namespace rls {
Napi::Value Transcode(const Napi::CallbackInfo& info);
Napi::Value NativeBlock(const Napi::CallbackInfo& info);
Napi::Value WriteNativeBlock(const Napi::CallbackInfo& info);
}
