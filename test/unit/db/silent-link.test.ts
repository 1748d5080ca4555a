import { describe, expect, it } from 'vitest';
import { clientKeepAliveDelayMs, silentLinkSessionSettings, startupOptions, withStartupOptions } from '../../../src/db/silent-link.js';

// database.linkTimeoutSeconds (decision 0092): the server's keepalive and tcp_user_timeout that
// end a silent client's session within the timeout, sent with every connection of Keel's.

describe('silentLinkSessionSettings', () => {
  it('ends a silent session within the timeout: first probe at half, the probes within the rest', () => {
    for (const seconds of [2, 3, 4, 6, 10, 20, 60, 600]) {
      const s = silentLinkSessionSettings(seconds);
      const detected = s.tcp_keepalives_idle! + s.tcp_keepalives_interval! * s.tcp_keepalives_count!;
      expect(detected, `${seconds} s`).toBeLessThanOrEqual(seconds);
      expect(detected, `${seconds} s`).toBeGreaterThanOrEqual(seconds * 0.75);
      expect(s.tcp_user_timeout).toBe(seconds * 1000);
    }
    expect(silentLinkSessionSettings(20)).toEqual({ tcp_keepalives_idle: 10, tcp_keepalives_interval: 3, tcp_keepalives_count: 3, tcp_user_timeout: 20_000 });
    // More than one probe once there is room for two: a single lost probe must not end a live session.
    for (const seconds of [3, 4, 6, 20, 60]) expect(silentLinkSessionSettings(seconds).tcp_keepalives_count, `${seconds} s`).toBeGreaterThanOrEqual(2);
  });

  it('has the client probe after half the timeout, at least a second', () => {
    expect(clientKeepAliveDelayMs(20)).toBe(10_000);
    expect(clientKeepAliveDelayMs(1)).toBe(1000);
  });
});

describe('withStartupOptions', () => {
  it('adds -c settings after the options a URL has, and keeps the rest of it', () => {
    const url = withStartupOptions('postgres://keel@db:5432/keel?options=-c%20work_mem%3D8MB&application_name=x', { tcp_user_timeout: 3000 });
    const parsed = new URL(url);
    expect(parsed.searchParams.get('options')).toBe('-c work_mem=8MB -c tcp_user_timeout=3000');
    expect(parsed.searchParams.get('application_name')).toBe('x');
    expect(parsed.host).toBe('db:5432');
    expect(startupOptions({ a: 1, b: 'x' })).toBe('-c a=1 -c b=x');
  });

  it("keeps the environment's PGOPTIONS when the URL names no options (node-postgres would drop it), and the URL's over it", () => {
    const fromEnv = new URL(withStartupOptions('postgres://keel@db/keel', { tcp_user_timeout: 3000 }, { PGOPTIONS: '-c faults.node=worker' }));
    expect(fromEnv.searchParams.get('options')).toBe('-c faults.node=worker -c tcp_user_timeout=3000');
    const fromUrl = new URL(withStartupOptions('postgres://keel@db/keel?options=-c%20a%3D1', { tcp_user_timeout: 3000 }, { PGOPTIONS: '-c b=2' }));
    expect(fromUrl.searchParams.get('options')).toBe('-c a=1 -c tcp_user_timeout=3000');
    expect(new URL(withStartupOptions('postgres://keel@db/keel', { x: 1 }, { PGOPTIONS: '' })).searchParams.get('options')).toBe('-c x=1');
  });

  it('keeps a Unix socket host', () => {
    const url = withStartupOptions('postgres://keel@%2Fvar%2Frun%2Fpostgresql/keel', { tcp_keepalives_idle: 10 });
    expect(url.startsWith('postgres://keel@%2Fvar%2Frun%2Fpostgresql/keel?options=')).toBe(true);
  });
});
