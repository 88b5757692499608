"""pyzlog.admin"""
