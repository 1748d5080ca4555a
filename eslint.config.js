import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  // .tmp/ is scratch (gitignored) that tests write while CI lints beside them (.ci/run).
  { ignores: ['node_modules/', 'dist/', '.keel/', '.tmp/', 'coverage/', 'test/e2e/screenshots/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly', Buffer: 'readonly', setTimeout: 'readonly', clearTimeout: 'readonly', setInterval: 'readonly', clearInterval: 'readonly' } },
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/consistent-type-imports': 'error',
      'no-console': 'off',
    },
  },
);
