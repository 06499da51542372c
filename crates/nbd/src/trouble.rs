//! Log lines about misbehaving clients, limited for the whole server.

/// Clients the server drops for breaking the protocol, or warns about,
/// logged for every connection of the server together: at most one line
/// per 10 s, with the count held back (session 29's hostile-client pass:
/// one script's 300 connections a second wrote 500 lines a second). The
/// rest go to the debug log.
static CLIENT_TROUBLE: jbdev_volume::ratelimit::RateLimit =
    jbdev_volume::ratelimit::RateLimit::new(std::time::Duration::from_secs(10));

/// Logs `what` about a misbehaving client (see [`CLIENT_TROUBLE`]).
pub(crate) fn client_trouble(what: std::fmt::Arguments<'_>) {
    match CLIENT_TROUBLE.pass(std::time::Instant::now()) {
        Some(held) => {
            let more = CLIENT_TROUBLE.held_note(held, "such client event(s)");
            tracing::info!("{what}{more}");
        }
        None => tracing::debug!("{what}"),
    }
}
