// The admin server's own Prometheus metrics (request counts and durations by route), registered once per
// registry: a second server on the same registry reuses them instead of failing on a duplicate name.
import { Counter, Histogram, type Registry } from 'prom-client';

export interface HttpMetrics {
  observe(method: string, route: string, status: number, seconds: number): void;
}

export function httpMetrics(registry: Registry): HttpMetrics {
  const requests =
    (registry.getSingleMetric('rlstream_admin_requests_total') as Counter<'method' | 'route' | 'status'> | undefined) ??
    new Counter({ name: 'rlstream_admin_requests_total', help: 'Admin API requests by route and status', labelNames: ['method', 'route', 'status'], registers: [registry] });
  const duration =
    (registry.getSingleMetric('rlstream_admin_request_seconds') as Histogram<'method' | 'route'> | undefined) ??
    new Histogram({
      name: 'rlstream_admin_request_seconds',
      help: 'Admin API request duration',
      labelNames: ['method', 'route'],
      buckets: [0.001, 0.005, 0.02, 0.1, 0.5, 2, 10],
      registers: [registry],
    });
  return {
    observe(method, route, status, seconds) {
      requests.inc({ method, route, status: String(status) });
      duration.observe({ method, route }, seconds);
    },
  };
}
