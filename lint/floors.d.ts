// Types of lint/floors.js (plain JavaScript, so that eslint.config.js loads it without a TypeScript loader).
import type { ESLint } from 'eslint';

export declare const FLOORS: Readonly<Record<string, readonly string[]>>;
export declare function floorOf(path: string): string | null;
export declare function violation(from: string, spec: string): string | null;
export declare const plugin: ESLint.Plugin;
