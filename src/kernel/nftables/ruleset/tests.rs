//! Decoding captured kernel messages.
