import { Redis, type RedisOptions } from 'ioredis';

// Workers and subscribers wait for Redis forever (BullMQ requires maxRetriesPerRequest: null);
// producers fail fast so an outage never stalls an HTTP request: the outbox sweeper re-sends.
export function createRedis(url: string, role: 'worker' | 'producer' | 'subscriber'): Redis {
  const opts: RedisOptions = {
    maxRetriesPerRequest: role === 'producer' ? 1 : null,
    enableOfflineQueue: role !== 'producer',
    retryStrategy: (times) => Math.min(times * 100, 2000),
    connectionName: `taskbridge:${role}`,
  };
  return new Redis(url, opts);
}
