// Worker-thread entry of an engine worker: the TypeScript loader is registered per thread, so register it
// here before importing the worker's module.
import { register } from 'tsx/esm/api';

register();
await import('./engine-worker.ts');
