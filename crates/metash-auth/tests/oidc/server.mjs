// A real OAuth 2.0 / OpenID Connect server for the auth tests: the `oidc-provider` package
// (pinned in scripts/setup), on 127.0.0.1 at a free port. It issues opaque access tokens for one
// API ("resource"), rotates refresh tokens, and serves device authorization, PKCE, revocation
// and introspection. The person who signs in is simulated: every interaction signs in "alice"
// and grants what the client asked. Prints `ready ISSUER` on stdout, then `grant TYPE` for each
// token granted and `grant-error TYPE ERROR` for each refused.
// Args: tools_dir [access_token_ttl_s] [refresh_token_ttl_s]
import { createRequire } from "node:module";
import http from "node:http";

const [, , tools, atTtl = "60", rtTtl = "3600"] = process.argv;
const require = createRequire(tools + "/package.json");
const { default: Provider } = await import(require.resolve("oidc-provider"));

const RESOURCE = "http://api.test/";
const server = http.createServer();
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: "metash-cli",
      application_type: "native",
      token_endpoint_auth_method: "none",
      redirect_uris: ["http://127.0.0.1/callback"],
      grant_types: ["authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:device_code"],
      response_types: ["code"],
    },
  ],
  scopes: ["openid", "offline_access", "repo", "read"],
  features: {
    devInteractions: { enabled: false },
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
    introspection: { enabled: true, allowedPolicy: async () => true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async () => RESOURCE,
      useGrantedResource: async () => true,
      getResourceServerInfo: async () => ({ scope: "repo read", accessTokenFormat: "opaque", accessTokenTTL: Number(atTtl) }),
    },
  },
  pkce: { required: () => true, methods: ["S256"] },
  cookies: { keys: ["metash-test-cookie-key"] },
  rotateRefreshToken: true,
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed("refresh_token"),
  ttl: { RefreshToken: Number(rtTtl), DeviceCode: 600, Interaction: 600, Session: 600, Grant: 3600 },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  findAccount: async (ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
});
provider.proxy = false;

// The person: signs in as alice, then grants the scopes asked for.
async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  if (process.env.OIDC_DEBUG) process.stderr.write(`interaction ${details.prompt.name} ${JSON.stringify(details.prompt.details)} ${JSON.stringify(details.params)}\n`);
  let result;
  if (details.prompt.name === "login") {
    result = { login: { accountId: "alice" } };
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const missing = details.prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(" "));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(missing.missingResourceScopes || {})) {
      grant.addResourceScope(resource, scopes.join(" "));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

const callback = provider.callback();
server.on("request", (req, res) => {
  if (req.url.startsWith("/interaction/")) {
    interaction(req, res).catch((e) => {
      res.statusCode = 500;
      res.end(String(e && e.stack || e));
    });
    return;
  }
  callback(req, res);
});
// What the tests count: each token granted, by grant type, and each refresh refused.
provider.on("grant.success", (ctx) => process.stdout.write(`grant ${ctx.oidc.params.grant_type}\n`));
provider.on("grant.error", (ctx, err) => process.stdout.write(`grant-error ${ctx.oidc.params && ctx.oidc.params.grant_type} ${err.error}\n`));
process.stdout.write(`ready ${issuer}\n`);
