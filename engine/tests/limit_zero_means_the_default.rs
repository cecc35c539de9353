//! Every list limit follows one rule: 0 means the default, a value above
//! the cap is refused, nothing is clamped. `HISTORY` and `CONV_LIST` used
//! to refuse 0 while `SYNC` and `PULL` took it as the default.

mod inbox_common;

use inbox_common::*;
use inbox_engine::*;

#[test]
fn history_and_conv_list_take_0_as_the_default_and_refuse_above_the_cap() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.send_many(ConvId(10), Uid(1), 100, 60);
    for conv in 20..125 {
        h.join(Uid(1), ConvId(conv));
    }
    let cfg = h.ib().config().clone();

    let page = h.ib().history(Uid(1), ConvId(10), None, 0).unwrap();
    assert_eq!(page.messages.len(), cfg.pull_per_conv_default as usize);
    assert!(page.has_more);
    assert!(matches!(
        h.ib()
            .history(Uid(1), ConvId(10), None, cfg.pull_per_conv_max + 1),
        Err(Error::BadRequest(_))
    ));

    let list = h.ib().conv_list(Uid(1), 0, None).unwrap();
    assert_eq!(list.convs.len(), cfg.sync_page_default as usize);
    assert!(list.next_cursor.is_some());
    assert!(matches!(
        h.ib().conv_list(Uid(1), cfg.sync_page_max + 1, None),
        Err(Error::BadRequest(_))
    ));

    let pulled = h.ib().pull(Uid(1), &[(ConvId(10), MsgSeq(0))], 0).unwrap();
    assert_eq!(pulled[0].messages.len(), cfg.pull_per_conv_default as usize);
    assert!(matches!(
        h.ib().pull(
            Uid(1),
            &[(ConvId(10), MsgSeq(0))],
            cfg.pull_per_conv_max + 1
        ),
        Err(Error::BadRequest(_))
    ));
}
