// A device field ('cuda') against this process: on a machine whose addon cannot run it, fails before any work,
// naming the field and the fix. The config itself compiles anywhere (it may be meant for another machine), so this
// is not part of config compilation: the process that makes the model runs it at start, and `rlstream config check`
// runs it too (cli/run/preflight.ts), so that a check ok on this machine means the run starts here.
import { ConfigError } from '../../core/config/validate.ts';
import { cudaAvailable, nativeAvailable, type DeviceKind } from '../../native/index.ts';

/** Throws ConfigError (CONFIG_INVALID) at `field` (trainer.device, backend.device) when `device` cannot run in this process. */
export function checkDeviceRunsHere(device: DeviceKind, field = 'trainer.device'): void {
  if (device !== 'cuda' || cudaAvailable()) return;
  const why =
    process.env['RLSTREAM_NATIVE'] === 'off'
      ? 'the native addon is turned off (RLSTREAM_NATIVE=off)'
      : !nativeAvailable()
        ? 'the native addon is not built here'
        : 'the native addon here has no usable CUDA GPU (built without RLSTREAM_CUDA=1, or no GPU visible to this process)';
  throw new ConfigError([
    {
      path: field,
      message: `'cuda' cannot run in this process: ${why}. Build the addon with CUDA on a machine with nvcc and an NVIDIA GPU (\`RLSTREAM_CUDA=1 npm run build:native\`, native/README.md), or set ${field}: cpu`,
    },
  ]);
}
