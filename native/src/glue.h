// Helpers shared by the N-API glue files: typed errors, typed-array arguments, a guard that turns C++ exceptions
// into JS exceptions, and an async worker that runs a job off the main thread. Glue only: no compute here.
#pragma once
#include <napi.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "errors.h"

namespace rls {

inline Napi::Error make_error(Napi::Env env, const char* code, const std::string& msg) {
  Napi::Error e = Napi::Error::New(env, msg);
  e.Set("code", Napi::String::New(env, code));
  return e;
}

// Runs fn; NativeError and any std::exception become a JS exception with a code (never std::terminate).
template <typename F>
auto guard(Napi::Env env, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Napi::Error&) {
    throw;
  } catch (const NativeError& e) {
    throw make_error(env, err_code_name(e.code), e.what());
  } catch (const std::bad_alloc&) {
    throw make_error(env, "NATIVE_INVALID_ARGUMENT", "out of memory");
  } catch (const std::exception& e) {
    throw make_error(env, "NATIVE_INVALID_ARGUMENT", e.what());
  }
}

template <typename T>
struct View {
  T* data = nullptr;
  size_t length = 0;
  Napi::Value holder;  // the typed array, kept alive by the worker while the job runs
};

template <typename T>
View<T> typed_arg(const Napi::Value& v, napi_typedarray_type type, const char* type_name, const std::string& what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type)
    invalid(what + " must be a " + type_name);
  auto ta = v.As<Napi::TypedArray>();
  View<T> r;
  r.length = ta.ElementLength();
  r.data = reinterpret_cast<T*>(static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
  r.holder = v;
  return r;
}
inline View<uint8_t> u8_arg(const Napi::Value& v, const std::string& what) {
  return typed_arg<uint8_t>(v, napi_uint8_array, "Buffer or Uint8Array", what);
}
inline View<double> f64_arg(const Napi::Value& v, const std::string& what) {
  return typed_arg<double>(v, napi_float64_array, "Float64Array", what);
}
inline View<int32_t> i32_arg(const Napi::Value& v, const std::string& what) {
  return typed_arg<int32_t>(v, napi_int32_array, "Int32Array", what);
}
inline View<float> f32_arg(const Napi::Value& v, const std::string& what) {
  return typed_arg<float>(v, napi_float32_array, "Float32Array", what);
}

inline void check_length(size_t got, size_t want, const std::string& what) {
  if (got != want)
    invalid(what + " has length " + std::to_string(got) + ", expected " + std::to_string(want) +
            " (one per token)");
}
inline void check_finite(const View<float>& v, const std::string& what) {
  for (size_t i = 0; i < v.length; i++)
    if (!std::isfinite(v.data[i]))
      non_finite(what + "[" + std::to_string(i) + "] is " + (std::isnan(v.data[i]) ? "NaN" : "infinite"));
}
inline double num_arg(const Napi::Value& v, const std::string& what) {
  if (!v.IsNumber()) invalid(what + " must be a number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d)) non_finite(what + " must be finite, got " + std::to_string(d));
  return d;
}
// A count or an offset into a block: a non-negative integer JS can hold exactly.
inline size_t count_arg(const Napi::Value& v, const std::string& what) {
  const double d = num_arg(v, what);
  if (d < 0 || d != std::floor(d) || d > 9007199254740991.0) invalid(what + " must be a non-negative integer");
  return (size_t)d;
}

// Runs `job` on the libuv thread pool and settles a promise on the main thread. `done` builds the resolved
// value on the main thread; `keep` are JS values (typed arrays, the model object) pinned until then.
class JobWorker : public Napi::AsyncWorker {
 public:
  JobWorker(Napi::Env env, std::function<void()> job, std::function<Napi::Value(Napi::Env)> done,
            std::function<void()> finally, const std::vector<Napi::Value>& keep)
      : Napi::AsyncWorker(env, "rlstream.native"),
        deferred_(Napi::Promise::Deferred::New(env)),
        job_(std::move(job)),
        done_(std::move(done)),
        finally_(std::move(finally)) {
    for (const auto& v : keep) keep_.push_back(Napi::Persistent(v));
  }
  Napi::Promise promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      job_();
    } catch (const NativeError& e) {
      code_ = err_code_name(e.code);
      SetError(e.what());
    } catch (const std::bad_alloc&) {
      SetError("out of memory");
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    finally_();
    Napi::Env env = Env();
    try {
      deferred_.Resolve(done_(env));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override {
    finally_();
    deferred_.Reject(make_error(Env(), code_, e.Message()).Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::function<void()> job_;
  std::function<Napi::Value(Napi::Env)> done_;
  std::function<void()> finally_;
  std::vector<Napi::Reference<Napi::Value>> keep_;
  const char* code_ = "NATIVE_INVALID_ARGUMENT";
};

}  // namespace rls
