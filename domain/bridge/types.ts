// What a credential controller, a function controller and a provider controller are to the
// bridge: descriptions (served by the catalog) plus the code that authorizes and invokes.
import type { TObject } from '@sinclair/typebox';
import type { InvokeResult } from '../shapes/bridge.ts';

// A provider instance's statuses (refresh_failed: a credential refresh gave up; it needs brokering again).
export const PROVIDER_STATUSES = ['brokering_initiated', 'active', 'disabled', 'refresh_failed'] as const;
export type ProviderStatus = (typeof PROVIDER_STATUSES)[number];

/** Credential values with their sensitive members decrypted: only ever held in memory. */
export type Plain = Record<string, unknown>;

// `signal`: the caller gave up (an agent run canceled, an HTTP client gone): the call is abandoned.
// `deadline` (epoch ms): when the invocation's `timeoutMs` runs out, for every call it makes.
export interface UpstreamOptions { timeoutMs: number; allowPrivate: boolean; signal?: AbortSignal; deadline?: number }

export interface CredentialControllerDef {
  type_id: string;
  name: string;
  documentation: string;
  requires_brokering: boolean;
  requires_resource_server_credential_refreshing: boolean;
  requires_user_credential_refreshing: boolean;
  resourceServer: TObject;
  /** null: this controller has no user credential. */
  userCredential: TObject | null;
  /** Members stored only encrypted, per credential kind. */
  sensitive: { resource_server: string[]; user: string[] };
  /** Checks beyond the schema (a parsable key, an allowed URL, a usable time): throws InvalidRequest, or returns the value to store. */
  normalize?(kind: 'resource_server' | 'user', value: Plain, opts: UpstreamOptions): Promise<Plain>;
  /** The Authorization header for the provider's API, if any. */
  authorization(rs: Plain | undefined, user: Plain | undefined, opts: UpstreamOptions): Promise<string | undefined>;
}

export interface InvokeCall {
  params: Record<string, unknown>; authorization: string | undefined; apiBase: string; timeoutMs: number; deadline: number; signal?: AbortSignal;
  /** For providers that honour one (IdempotencyKey); others ignore it. */
  idempotencyKey?: string;
}

export interface FunctionControllerDef {
  type_id: string;
  name: string;
  documentation: string;
  categories: string[];
  parameters: TObject;
  output: TObject;
  invoke(call: InvokeCall): Promise<InvokeResult>;
}

export interface ProviderControllerDef {
  type_id: string;
  name: string;
  documentation: string;
  categories: string[];
  credentialControllers: CredentialControllerDef[];
  functions: FunctionControllerDef[];
  /** The configuration setting that holds the provider's API base URL. */
  apiBaseSetting: 'STRIPE_API_BASE_URL' | 'GOOGLE_MAIL_API_BASE_URL';
  /** The provider's OAuth endpoints (settings), for brokering and refreshing user credentials, and
   * the scopes asked for when the resource server credential names none. */
  oauth?: { authorizeUrlSetting: 'GOOGLE_OAUTH_AUTHORIZE_URL'; tokenUrlSetting: 'GOOGLE_OAUTH_TOKEN_URL'; authorizeParams: Record<string, string>; defaultScopes: string[] };
}
