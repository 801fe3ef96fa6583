// Provider APIs and webhook receivers as one local server, recording every request:
//   POST /v1/refunds                        Stripe: 401 unless the bearer is `stripeKey` (when given);
//                                           payment_intent pi_refused is refused (400), pi_hold is never
//                                           answered (see nextHold), pi_odd answers a refund whose amount
//                                           is a string, pi_extra one with a 200 kB member, pi_null one with the
//                                           members Stripe declares nullable null; else the refund object
//   POST /gmail/v1/users/me/messages/send   Gmail: {id: msg-<n>}
//   POST /token/hold                        a token endpoint that never answers (see nextHold)
//   anything else                           200 {} (webhooks)
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Seen { url: string; authorization?: string; token?: string; idempotencyKey?: string; body: string }
export interface FakeProviders {
  url: string; seen: Seen[]; close(): void;
  /** The next request held unanswered to arrive (or the earliest unclaimed one), with its connection's close. */
  nextHold(): Promise<{ closed: Promise<void> }>;
}

export function startFakeProviders(opts: { stripeKey?: string } = {}): Promise<FakeProviders> {
  const seen: Seen[] = [];
  const held: { closed: Promise<void> }[] = [];
  const holdWaiters: ((h: { closed: Promise<void> }) => void)[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ url: req.url!, authorization: req.headers.authorization, token: req.headers['x-a2a-notification-token'] as string | undefined, idempotencyKey: req.headers['idempotency-key'] as string | undefined, body });
      const send = (status: number, json: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(json));
      const hold = () => {
        const h = { closed: new Promise<void>((resolve) => res.once('close', () => resolve())) };
        const waiter = holdWaiters.shift();
        if (waiter) waiter(h);
        else held.push(h);
      };
      if (req.url === '/token/hold') return hold();
      if (req.url === '/v1/refunds') {
        if (opts.stripeKey && req.headers.authorization !== `Bearer ${opts.stripeKey}`) return send(401, { error: { message: 'Invalid API Key provided' } });
        const form = new URLSearchParams(body);
        if (form.get('payment_intent') === 'pi_refused') return send(400, { error: { type: 'invalid_request_error', message: "No such payment_intent: 'pi_refused'" } });
        if (form.get('payment_intent') === 'pi_hold') return hold();
        if (form.get('payment_intent') === 'pi_odd') return send(200, { id: 're_odd', object: 'refund', amount: 'ten', status: 'succeeded' });
        if (form.get('payment_intent') === 'pi_null') {
          return send(200, { id: 're_null', object: 'refund', amount: 1000, status: null, currency: 'eur', created: 1700000000, charge: null, payment_intent: null, reason: null, balance_transaction: null, metadata: {} });
        }
        if (form.get('payment_intent') === 'pi_extra') return send(200, { id: 're_extra', object: 'refund', amount: 1000, status: 'succeeded', currency: 'eur', padding: 'x'.repeat(200_000) });
        return send(200, { id: 're_1', object: 'refund', amount: Number(form.get('amount') ?? 1000), status: 'succeeded', payment_intent: form.get('payment_intent') });
      }
      if (req.url === '/gmail/v1/users/me/messages/send') return send(200, { id: `msg-${seen.length}`, threadId: 't' });
      return send(200, {});
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen,
    close: () => { server.closeAllConnections(); server.close(); },
    nextHold: () => new Promise((resolve) => { const h = held.shift(); if (h) resolve(h); else holdWaiters.push(resolve); }),
  })));
}
