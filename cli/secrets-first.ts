// The first module the CLI evaluates (cli/main.ts imports it before anything else): the token variables leave
// this process's environment, /proc/self/environ included, before any other code runs, so no child process,
// library or user query of this process can find a token there. Their values stay with core/auth/environ.ts.
import { takeSecretsFromEnvironment } from '../core/auth/environ.ts';

takeSecretsFromEnvironment();
