import { Redis, type RedisOptions } from 'ioredis';

// Workers and subscribers wait for Redis forever (BullMQ requires maxRetriesPerRequest: null);
// producers fail fast so an outage never stalls an HTTP request: the outbox sweeper re-sends.
// `commandTimeoutMs` (producers: DB_QUERY_TIMEOUT_MS): a Redis that keeps the connection open but
// never answers (a partition, a connection a NAT gateway dropped) fails the command then, as one that
// refuses does at once, and the connection is made again: replies that never came would otherwise
// be taken for the answers to the commands after them, or the dead connection kept for ever.
export function createRedis(url: string, role: 'worker' | 'producer' | 'subscriber', commandTimeoutMs = 0): Redis {
  const opts: RedisOptions = {
    maxRetriesPerRequest: role === 'producer' ? 1 : null,
    enableOfflineQueue: role !== 'producer',
    ...(commandTimeoutMs > 0 ? { commandTimeout: commandTimeoutMs } : {}),
    retryStrategy: (times) => Math.min(times * 100, 2000),
    connectionName: `taskbridge:${role}`,
  };
  const redis = new Redis(url, opts);
  if (commandTimeoutMs > 0) {
    const send = redis.sendCommand.bind(redis);
    // Once per socket: the commands that time out together would each close it again (the status
    // stays ready until it has closed), each adding a 'close' listener to it. Keyed by the socket the
    // command went out on, not a flag reset on 'ready', which a Redis that stays away never sends.
    const dropped = new WeakSet<object>();
    redis.sendCommand = (command, stream) => {
      const socket = redis.stream;
      const answer = send(command, stream);
      command.promise.catch((err: Error) => {
        if (err.message !== 'Command timed out' || redis.status !== 'ready') return;
        if (!socket || socket !== redis.stream || dropped.has(socket)) return;
        dropped.add(socket);
        redis.disconnect(true);
      });
      return answer;
    };
  }
  return redis;
}
