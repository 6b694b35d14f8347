// Local ports for services a test starts on its own (a private broker, a private registry): a free one to
// listen on, and whether something already listens on one.
import { createServer, Socket, type Server } from 'node:net';

/** One free port (see freePorts: a service needing several must ask for them together). */
export async function freePort(): Promise<number> {
  return (await freePorts(1))[0]!;
}

/**
 * `n` distinct free ports: each listened on until all are found (a port closed at once can be handed out again
 * by the next call, which gave a broker the same port for two listeners).
 */
export async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from({ length: n }, () => new Promise<Server>((res, rej) => {
      const s = createServer();
      s.once('error', rej);
      s.listen(0, '127.0.0.1', () => res(s));
    })),
  );
  const ports = servers.map((s) => {
    const a = s.address();
    return typeof a === 'object' && a ? a.port : 0;
  });
  await Promise.all(servers.map((s) => new Promise((res) => s.close(res))));
  return ports;
}

export function canConnect(port: number): Promise<boolean> {
  return new Promise((res) => {
    const s = new Socket();
    s.once('connect', () => (s.destroy(), res(true)));
    s.once('error', () => (s.destroy(), res(false)));
    s.connect(port, '127.0.0.1');
  });
}
