import net from 'node:net';

// A TCP proxy in front of Postgres whose connections a test can cut one by one, the way a dropped
// network path or a dead peer cuts them: Keel's side sees "Connection terminated unexpectedly"
// while the server may still finish (and commit) the statement it was running.

export type CuttingProxy = {
  /** A database URL like `url`, through the proxy. */
  urlFor: (url: string) => string;
  /** Cuts the connection whose socket to the server has this local port (pg_stat_activity.client_port); false if there is none. */
  cut: (serverSidePort: number) => boolean;
  close: () => Promise<void>;
};

export async function startCuttingProxy(target: { host: string; port: number } = { host: '127.0.0.1', port: 5432 }): Promise<CuttingProxy> {
  const pairs = new Map<number, { client: net.Socket; upstream: net.Socket }>();
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    upstream.once('connect', () => {
      if (upstream.localPort !== undefined) pairs.set(upstream.localPort, { client, upstream });
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    urlFor: (url) => {
      const through = new URL(url);
      through.hostname = '127.0.0.1';
      through.port = String(port);
      return through.toString();
    },
    cut: (serverSidePort) => {
      const pair = pairs.get(serverSidePort);
      if (!pair) return false;
      pairs.delete(serverSidePort);
      // Keel's side first: its client hears the end before the server can answer.
      pair.client.destroy();
      pair.upstream.destroy();
      return true;
    },
    close: async () => {
      for (const pair of pairs.values()) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
