// Gmail: sends a plain-text message through users.messages.send (an RFC 2822 message, base64url).
import { Type } from '@sinclair/typebox';
import { oauthAuthFlow, oauthJwtBearer } from '../credential-controllers.ts';
import { Upstream } from '../../errors.ts';
import { callUpstream, refusalMessage, successObject } from '../upstream.ts';
import type { ProviderControllerDef } from '../types.ts';
import { worded } from '../../schema-check.ts';

// No CR/LF in header values: a subject or address must not be able to add headers.
const HeaderSafe = (d: string, max: number) => Type.String({ minLength: 1, maxLength: max, pattern: worded('^[^\\r\\n]+$', 'must be one line (no CR or LF)'), description: d });

function rfc2822(to: string, subject: string, body: string): string {
  const encodedSubject = /^[\x20-\x7e]*$/.test(subject) ? subject : `=?UTF-8?B?${Buffer.from(subject).toString('base64')}?=`;
  return [`To: ${to}`, `Subject: ${encodedSubject}`, 'MIME-Version: 1.0', 'Content-Type: text/plain; charset="UTF-8"', 'Content-Transfer-Encoding: 8bit', '', body].join('\r\n');
}

export const googleMail: ProviderControllerDef = {
  type_id: 'google_mail',
  name: 'Google Mail',
  documentation: 'Gmail API. Authenticates as a user who granted access (OAuth authorization code) or as a service account (JWT bearer assertion).',
  categories: ['email'],
  credentialControllers: [oauthAuthFlow, oauthJwtBearer],
  apiBaseSetting: 'GOOGLE_MAIL_API_BASE_URL',
  // offline + consent: Google returns a refresh token (again) on every grant. Google refuses an
  // authorize URL without a scope; gmail.send is what send_email needs.
  oauth: {
    authorizeUrlSetting: 'GOOGLE_OAUTH_AUTHORIZE_URL', tokenUrlSetting: 'GOOGLE_OAUTH_TOKEN_URL', authorizeParams: { access_type: 'offline', prompt: 'consent' },
    defaultScopes: ['https://www.googleapis.com/auth/gmail.send'],
  },
  functions: [{
    type_id: 'google_mail_send_email',
    name: 'Send email',
    documentation: 'Sends a plain-text email from the authorized account.',
    categories: ['email'],
    parameters: Type.Object({
      to: HeaderSafe('recipient address(es), comma separated', 2048),
      subject: HeaderSafe('subject line', 998),
      body: Type.String({ maxLength: 1_000_000, description: 'plain-text body' }),
    }, { additionalProperties: false }),
    output: Type.Object({ message_id: Type.String() }),
    async invoke({ params, authorization, apiBase, timeoutMs, deadline, signal }) {
      const raw = Buffer.from(rfc2822(String(params.to), String(params.subject), String(params.body))).toString('base64url');
      const answer = await callUpstream('google_mail', `${apiBase}/gmail/v1/users/me/messages/send`, {
        method: 'POST',
        headers: { authorization: authorization!, 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify({ raw }),
        signal,
      }, timeoutMs, { deadline });
      if (answer.status >= 400) return { type: 'error', message: refusalMessage(answer) };
      const { id } = successObject('google_mail', answer);
      if (typeof id !== 'string' || !id) throw new Upstream(`google_mail: answered HTTP ${answer.status} without a message id`, { upstream: 'google_mail' });
      return { type: 'success', message_id: id };
    },
  }],
};
