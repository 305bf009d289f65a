-- Signing secrets encrypted at rest (issue 17): a service's signing secret,
-- and the previous one during a rotation, are stored as
-- `wpenc:v1:<key id>:<base64 of nonce and ciphertext>`, sealed with
-- WATCHPUMP_SECRET_KEY (src/services/at_rest.rs), never as `whsec_...`.
-- Applied once.
--
-- The new checks are NOT VALID: they hold for every row written from now
-- on, while the clear secrets already stored stay readable until
-- `watchpump migrate` (with the key) seals them in place, right after this
-- file, in the same run. An update that would leave a secret in clear is
-- refused.

alter table watchpump.services
    drop constraint services_signing_secret_check,
    drop constraint services_previous_signing_secret_check,
    add constraint services_signing_secret_sealed
        check (signing_secret ~ '^wpenc:v1:[0-9a-f]{8}:[A-Za-z0-9+/]+={0,2}$') not valid,
    add constraint services_previous_signing_secret_sealed
        check (previous_signing_secret ~ '^wpenc:v1:[0-9a-f]{8}:[A-Za-z0-9+/]+={0,2}$') not valid;
