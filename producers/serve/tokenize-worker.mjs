// Worker-thread entry of the serving endpoint's tokenizer worker: the TypeScript loader is registered per thread,
// so register it here before importing the worker's module.
import { register } from 'tsx/esm/api';

register();
await import('./tokenize-worker.ts');
