import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';

const COLORS = ['#2563eb', '#16a34a', '#dc2626', '#9333ea', '#ea580c'];

/**
 * A time-series chart (uPlot). `data` is uPlot's columnar form: [xs (unix seconds),
 * ys1, ys2, ...]; `series` names each y column; `axes` optionally gives each series a
 * scale name and a value formatter (two scales: left and right axes).
 */
export function Chart({ title, series, data, height = 200, testid }) {
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const scales = [...new Set(series.map((s) => s.scale || 'y'))];
    const opts = {
      width: Math.max(box.current.clientWidth, 300),
      height,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      series: [
        {},
        ...series.map((s, i) => ({
          label: s.label,
          scale: s.scale || 'y',
          stroke: COLORS[i % COLORS.length],
          width: 2,
          value: (_, v) => (v == null ? '—' : s.fmt ? s.fmt(v) : v.toFixed(1)),
        })),
      ],
      axes: [
        {},
        ...scales.map((scale, i) => {
          const s = series.find((x) => (x.scale || 'y') === scale);
          return {
            scale,
            side: i === 0 ? 3 : 1,
            size: 70,
            grid: { show: i === 0 },
            values: (_, ticks) => ticks.map((v) => (s.fmt ? s.fmt(v) : String(v))),
          };
        }),
      ],
    };
    plot.current = new uPlot(opts, data, box.current);
    const resize = new ResizeObserver(() => {
      if (box.current && plot.current) plot.current.setSize({ width: Math.max(box.current.clientWidth, 300), height });
    });
    resize.observe(box.current);
    return () => {
      resize.disconnect();
      plot.current.destroy();
      plot.current = null;
    };
  }, []);
  useEffect(() => {
    if (plot.current) plot.current.setData(data);
  }, [data]);
  return (
    <figure class="chart" data-testid={testid}>
      <figcaption>{title}</figcaption>
      <div ref={box} />
    </figure>
  );
}
