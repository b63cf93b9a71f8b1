//! zygote VMM (being written)
