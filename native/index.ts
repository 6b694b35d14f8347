// The whole native surface for callers that want all of it (tests, tools): the policy model (native/model.ts),
// the codecs (native/codecs.ts) and the addon's availability (native/addon.ts). Library code imports the part it
// uses, so the embedded log and the trace sink never load the model's TypeScript.
export * from './model.ts';
export * from './codecs.ts';
export { cudaAvailable, cudaMemory, nativeAvailable, sgemmGflops } from './addon.ts';
