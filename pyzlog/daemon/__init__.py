"""pyzlog.daemon"""
