"""pdops pipeline: release spec -> serve config -> manifest -> checks -> target -> promote | rollback."""
