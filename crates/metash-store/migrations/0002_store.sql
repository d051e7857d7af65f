-- metash on PostgreSQL, version 2: the store's API (`[store] url`): each project's identity,
-- its session (a view of the log, written in the same transaction as its event), and its
-- documents (KV namespaces, the scratchpad, consent, the other layers' small documents),
-- each row a document under its name relative to `.meta/` (`kv/agent.json`, `consent.json`).

CREATE TABLE metash.projects (
    project        text        PRIMARY KEY,
    context        text        NOT NULL,
    context_sha256 text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE metash.sessions (
    project  text   PRIMARY KEY,
    revision bigint NOT NULL,
    doc      jsonb  NOT NULL
);

CREATE TABLE metash.docs (
    project text  NOT NULL,
    name    text  NOT NULL,
    doc     jsonb NOT NULL,
    PRIMARY KEY (project, name)
);
