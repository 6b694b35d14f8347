// Local ports for services a test starts on its own (a private broker, a private registry): a free one to
// listen on, and whether something already listens on one.
import { createServer, Socket } from 'node:net';

export async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => res(typeof a === 'object' && a ? a.port : 0));
    });
  });
}

export function canConnect(port: number): Promise<boolean> {
  return new Promise((res) => {
    const s = new Socket();
    s.once('connect', () => (s.destroy(), res(true)));
    s.once('error', () => (s.destroy(), res(false)));
    s.connect(port, '127.0.0.1');
  });
}
