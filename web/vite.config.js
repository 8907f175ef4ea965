// Builds the console into dist/, which the binary embeds (src/admin/console.rs).
// Fixed, content-hashed names under assets/; no inline script or style (the server's
// Content-Security-Policy forbids both) and no asset from another origin.
import { defineConfig } from 'vite';

export default defineConfig({
  base: '/',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: 'dist',
    assetsDir: 'assets',
    emptyOutDir: true,
    // Every asset a file of its own: a data: URI for a font or image would still work
    // under the policy, but files keep the size budget easy to read.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
    target: 'es2022',
    rollupOptions: {
      output: {
        entryFileNames: 'assets/console-[hash].js',
        chunkFileNames: 'assets/[name]-[hash].js',
        assetFileNames: 'assets/console-[hash][extname]',
      },
    },
  },
});
