//! Joining a cluster: invite tokens, the enrolment request a member receives, the reply a joining node
//! opens, and the invite book on disk — against a real book holding a real invite.

use std::sync::OnceLock;

use shoal_cluster::invite::{
    EnrollReply, EnrollRequest, INVITES_FILE, Invite, InviteBook, InviteToken,
};

struct Book {
    _dir: tempfile::TempDir,
    book: InviteBook,
    invite: Invite,
    /// A second book whose file the fuzzer writes.
    scratch: tempfile::TempDir,
}

fn book() -> &'static Book {
    static BOOK: OnceLock<Book> = OnceLock::new();
    BOOK.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a state folder");
        let book = InviteBook::new(dir.path());
        let invite = book.create(None, None).expect("an invite");
        Book {
            _dir: dir,
            book,
            invite,
            scratch: tempfile::tempdir().expect("a state folder"),
        }
    })
}

/// Pieces ([`crate::pieces`]): a token's text, an enrolment request (JSON), a reply (JSON), a node id, an
/// invite book's file. A token that parses encodes back to itself; no request the fuzzer writes redeems
/// the book's invite (it would need the invite's secret), and none uses it up; no reply opens under a
/// token for that invite (it would need the secret to seal); a damaged book is an error, not a panic.
pub fn invite(data: &[u8]) {
    let b = book();
    let mut pieces = crate::pieces(data).into_iter();
    let text = |p: Option<&[u8]>| String::from_utf8_lossy(p.unwrap_or_default()).into_owned();
    let token = text(pieces.next());
    if let Some(t) = InviteToken::parse(&token) {
        assert_eq!(
            InviteToken::parse(&t.encode()),
            Some(t),
            "a parsed token round-trips"
        );
    }
    let request = pieces.next().unwrap_or_default();
    if let Ok(mut req) = serde_json::from_slice::<EnrollRequest>(request) {
        assert!(b.book.redeem(&req, 0).is_err(), "a forged request redeemed");
        req.invite = b.invite.id.clone();
        assert!(
            b.book.redeem(&req, 0).is_err(),
            "a forged request redeemed the real invite"
        );
    }
    let reply = pieces.next().unwrap_or_default();
    let node = text(pieces.next());
    if let Ok(reply) = serde_json::from_slice::<EnrollReply>(reply) {
        let token = InviteToken {
            id: b.invite.id.clone(),
            secret: secret_of(&b.invite),
            urls: vec!["http://127.0.0.1:1".into()],
        };
        assert!(token.open(&node, &reply).is_err(), "a forged reply opened");
    }
    let file = pieces.next().unwrap_or_default();
    std::fs::write(b.scratch.path().join(INVITES_FILE), file).expect("written");
    let scratch = InviteBook::new(b.scratch.path());
    if let Ok(list) = scratch.list() {
        let _ = list.len();
    }
    assert!(
        b.book
            .list()
            .expect("the real book reads")
            .iter()
            .any(|i| i.id == b.invite.id),
        "the real invite is still there"
    );
}

/// The invite's 32-byte secret (the book holds it as hex).
fn secret_of(invite: &Invite) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&invite.secret[2 * i..2 * i + 2], 16)
            .expect("the book's secret is hex");
    }
    out
}
