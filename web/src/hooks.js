import { useEffect, useRef, useState } from 'preact/hooks';

/**
 * Calls `fn` now and every `ms` while the component is mounted (the next call starts
 * after the previous one settles, so a slow server is never flooded). Returns
 * {data, error, refresh}.
 */
export function usePoll(fn, ms, deps = []) {
  const [state, setState] = useState({ data: undefined, error: null });
  const tick = useRef(() => {});
  useEffect(() => {
    let alive = true;
    let timer;
    const run = async () => {
      clearTimeout(timer);
      try {
        const data = await fn();
        if (alive) setState({ data, error: null });
      } catch (error) {
        if (alive) setState((s) => ({ data: s.data, error }));
      }
      if (alive) timer = setTimeout(run, ms);
    };
    tick.current = run;
    run();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, deps);
  return { ...state, refresh: () => tick.current() };
}
