// A real OpenID Connect provider for the /ui SSO tests: the npm package `oidc-provider` (pinned in
// tests/ui/conftest.py), one confidential client, PKCE required, ID tokens signed RS256 with a key
// made at start. Its only test-specific part is the interaction: a one-field form ("user") that logs
// that user in and consents at once (no password: the gateway's side of the flow is what is tested).
//
// usage: node oidc_provider.mjs PORT REDIRECT_URI CLIENT_SECRET URL_FILE
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const [port, redirectUri, clientSecret, urlFile] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signing = { ...privateKey.export({ format: 'jwk' }), kid: 'test-rs256', alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  clients: [{
    client_id: 'dharma-ui',
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    response_types: ['code'],
    grant_types: ['authorization_code'],
    token_endpoint_auth_method: 'client_secret_basic',
    application_type: 'native', // allows the loopback http redirect URI of the test gateway
  }],
  pkce: { required: () => true },
  jwks: { keys: [signing] },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  findAccount: async (ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
});

const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

async function readForm(req) {
  let body = '';
  for await (const chunk of req) body += chunk;
  return new URLSearchParams(body);
}

provider.use(async (ctx, next) => {
  const match = /^\/interaction\/([^/]+)(\/login)?$/.exec(ctx.path);
  if (!match) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (ctx.method === 'GET' && !match[2]) {
    ctx.type = 'html';
    ctx.body = `<!doctype html><title>Test IdP</title><h1>Test identity provider</h1>
<form method="post" action="/interaction/${escape(details.uid)}/login">
<label for="user">User</label> <input id="user" name="user" required autofocus>
<button type="submit">Sign in</button></form>`;
    return undefined;
  }
  if (ctx.method === 'POST' && match[2]) {
    const accountId = (await readForm(ctx.req)).get('user');
    const grant = new provider.Grant({ accountId, clientId: details.params.client_id });
    grant.addOIDCScope(details.params.scope);
    const grantId = await grant.save();
    const target = await provider.interactionResult(ctx.req, ctx.res, { login: { accountId }, consent: { grantId } });
    ctx.status = 303;
    ctx.redirect(target);
    return undefined;
  }
  return next();
});

provider.listen(Number(port), '127.0.0.1', () => writeFileSync(urlFile, `${issuer}\n`));
