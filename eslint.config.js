// Lint: typescript-eslint's recommended rules; library code logs through core/telemetry, never console; each floor
// imports only what lint/floors.js allows it.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import { plugin as rlstream } from './lint/floors.js';

export default tseslint.config(
  { ignores: ['node_modules/', 'dist/', 'native/build/', '.rlstream/', '.infra/', 'admin/public/vendor/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      'no-console': 'error',
    },
  },
  { plugins: { rlstream }, rules: { 'rlstream/floors': 'error' } },
  { files: ['cli/**', 'bench/**', 'test/**', 'infra/**', 'examples/**', 'bin/**', 'schemas/codegen.ts'], rules: { 'no-console': 'off' } },
);
