// Stripe: refunds through the real Refunds API (form-encoded POST /v1/refunds).
import { Type, type TSchema } from '@sinclair/typebox';
import { apiKey } from '../credential-controllers.ts';
import { callUpstream, refusalMessage, successObject } from '../upstream.ts';
import type { ProviderControllerDef } from '../types.ts';
import { worded } from '../../schema-check.ts';

const Short = (description: string) => Type.String({ maxLength: 255, description });
const OrNull = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Id = (d: string) => Type.String({ pattern: worded('^[A-Za-z0-9_]{1,255}$', 'must be 1 to 255 of A-Z a-z 0-9 _'), description: d });

export const stripe: ProviderControllerDef = {
  type_id: 'stripe',
  name: 'Stripe',
  documentation: 'Payments. Authenticates with a secret API key.',
  categories: ['payments'],
  credentialControllers: [apiKey],
  apiBaseSetting: 'STRIPE_API_BASE_URL',
  functions: [{
    type_id: 'stripe_process_refund',
    name: 'Process refund',
    documentation: 'Refunds a charge or payment intent, in full or the given amount (in the smallest currency unit). Returns Stripe\'s refund object.',
    categories: ['payments'],
    parameters: Type.Object({
      payment_intent: Type.Optional(Id('payment intent to refund (pi_...)')),
      charge: Type.Optional(Id('charge to refund (ch_...)')),
      amount: Type.Optional(Type.Integer({ minimum: 1, maximum: 99999999, description: 'amount to refund; the whole payment when absent' })),
      reason: Type.Optional(Type.Union(['duplicate', 'fraudulent', 'requested_by_customer'].map((r) => Type.Literal(r)))),
    }, { additionalProperties: false, oneOf: [{ required: ['payment_intent'] }, { required: ['charge'] }], description: 'payment_intent or charge, not both' }),
    // Stripe's refund object, the members a caller acts on; the others (and any Stripe adds) are left out.
    // Null where Stripe's API reference declares the member nullable (status too).
    output: Type.Object({
      id: Short('refund id (re_...)'),
      object: Type.Literal('refund'),
      amount: Type.Integer({ description: 'amount refunded, in the smallest currency unit' }),
      status: OrNull(Short('pending, requires_action, succeeded, failed or canceled')),
      currency: Type.Optional(Short('three-letter ISO currency code')),
      created: Type.Optional(Type.Integer({ description: 'Unix time the refund was created' })),
      charge: Type.Optional(OrNull(Short('charge refunded (ch_...)'))),
      payment_intent: Type.Optional(OrNull(Short('payment intent refunded (pi_...)'))),
      reason: Type.Optional(OrNull(Short('reason given for the refund'))),
      failure_reason: Type.Optional(OrNull(Short('why a failed refund failed'))),
      balance_transaction: Type.Optional(OrNull(Short('balance transaction (txn_...)'))),
      metadata: Type.Optional(OrNull(Type.Record(Type.String(), Type.String(), { description: 'key-value pairs set on the refund' }))),
    }, { additionalProperties: false }),
    async invoke({ params, authorization, apiBase, timeoutMs, deadline, signal, idempotencyKey }) {
      const form = new URLSearchParams();
      for (const k of ['payment_intent', 'charge', 'amount', 'reason']) if (params[k] !== undefined) form.set(k, String(params[k]));
      const answer = await callUpstream('stripe', `${apiBase}/v1/refunds`, {
        method: 'POST',
        headers: {
          authorization: authorization!, 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json',
          ...(idempotencyKey ? { 'idempotency-key': idempotencyKey } : {}),
        },
        body: form.toString(),
        signal,
      }, timeoutMs, { deadline });
      if (answer.status >= 400) return { type: 'error', message: refusalMessage(answer) };
      return { ...successObject('stripe', answer), type: 'success' };
    },
  }],
};
